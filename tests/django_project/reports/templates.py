"""A dtask template beside the team's own tasks (named in CELERY_DTASK_TEMPLATES)."""

import time

import dtask


@dtask.template(
    "report_range",
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("delay",)),
    checkpoint_every=1,
    checkpoint_interval=3600,
    reduce=sum,
)
def report_range(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> int:
    """Its part of 1 + 2 + ... + n. The total lives in ``ctx.state``, committed with each
    checkpoint: an attempt resumed elsewhere returns the whole, not only what it added."""
    ctx.state.setdefault("total", 0)
    for i in ctx.resume(range(a, b + 1)):
        time.sleep(delay)
        ctx.state["total"] += i
    return int(ctx.state["total"])
