"""The team's own task: not dtask's. A deploy's SIGTERM must let it finish (warm shutdown).
And a dtask template beside it, as a team may keep one in its tasks module."""

import time

from celery import shared_task

import dtask
from reports.models import Report


@shared_task
def slow_report(name: str, seconds: float) -> str:
    time.sleep(seconds)
    Report.objects.create(name=name, value=1)
    return name


@dtask.template(
    "report_total",
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("delay",)),
    reduce=sum,
)
def report_total(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> int:
    """a..b added up, its running total in the checkpoint: a child handed over (a deploy's
    SIGTERM) resumes where it stopped and still returns the whole sum."""
    saved = ctx.checkpoint_state or {"next": a, "total": 0}
    total = int(saved["total"])
    for i in range(int(saved["next"]), b + 1):
        time.sleep(delay)
        total += i
        ctx.checkpoint({"next": i + 1, "total": total})  # stops here when asked to
    return total
