"""The project's own task, and a dtask template beside it."""

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
