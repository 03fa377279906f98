"""The project's own task, and a dtask template beside it."""

import json
import os
import time
from pathlib import Path

import dtask
from proj.celery import app


@app.task
def add(x: int, y: int) -> int:
    with (Path(os.environ["PROJ_SINK"]) / "add.txt").open("a") as out:
        out.write(f"{x + y}\n")
    return x + y


@dtask.template(
    "proj_range",
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=20, carry=("delay",)),
    checkpoint_every=5,
    checkpoint_interval=3600,
)
def proj_range(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    """Appends each item to ``<PROJ_SINK>/<run>-<child>.txt`` (with the attempt)."""
    sink = Path(os.environ["PROJ_SINK"]) / f"{ctx.run_id}-{ctx.index}.txt"
    with sink.open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            out.write(f"{i} {ctx.attempt}\n")
            out.flush()


def _add_up(ctx: dtask.ChildContext, a: int, b: int, delay: float, *, keep_in_state: bool) -> int:
    """Numbers a..b added up over ``ctx.resume``: in ``ctx.state`` (the documented way, kept
    with each checkpoint), or in a local variable (which holds only this attempt's items)."""
    if keep_in_state:
        ctx.state.setdefault("total", 0)
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            ctx.state["total"] += i
        return int(ctx.state["total"])
    total = 0
    for i in ctx.resume(range(a, b + 1)):
        time.sleep(delay)
        total += i
    return total


TOTALS = {
    "params": {"n": int, "delay": float},
    "skeleton": {"start": 1, "end": "${n}", "delay": "${delay}"},
    "split": dtask.RangeSplit("start", "end", chunk=100, carry=("delay",)),
    "checkpoint_every": 5,
    "checkpoint_interval": 3600,
    "reduce": sum,
}


@dtask.template("proj_total", **TOTALS)
def proj_total(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> int:
    """The sum a..b kept in ``ctx.state``: the whole sum after a failover too."""
    return _add_up(ctx, a, b, delay, keep_in_state=True)


@dtask.template("proj_total_local", **TOTALS)
def proj_total_local(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> int:
    """The same sum in a local variable: a resumed attempt returns only what it processed."""
    return _add_up(ctx, a, b, delay, keep_in_state=False)


@app.task
def record(value: object) -> object:
    """The step after a run in a chain: appends what it got, and when, to
    ``<PROJ_SINK>/chain.jsonl``."""
    with (Path(os.environ["PROJ_SINK"]) / "chain.jsonl").open("a") as out:
        out.write(json.dumps({"got": value, "at": time.time()}) + "\n")
    return value


@app.task
def on_chain_error(request: object, exc: BaseException, traceback: object) -> None:
    """A chain's errback (Celery's ``(request, exc, traceback)`` form): appends the failed
    task's id and the error to ``<PROJ_SINK>/errors.jsonl``."""
    with (Path(os.environ["PROJ_SINK"]) / "errors.jsonl").open("a") as out:
        failed = {"task": getattr(request, "id", None), "type": type(exc).__name__}
        out.write(json.dumps({**failed, "error": str(exc), "at": time.time()}) + "\n")


@dtask.template(
    "proj_fails",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    max_attempts=1,
)
def proj_fails(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """A run that fails: every child raises."""
    raise ValueError(f"no numbers {a}..{b} today")
