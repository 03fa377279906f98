"""Templates the benchmarks load into their workers (DTASK_TEMPLATES=bench.templates)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import dtask


@dtask.template(
    "bench_slow",
    params={"items": int, "delay": float},
    skeleton={"start": 1, "end": "${items}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=10**9, carry=("delay",)),
    max_attempts=20,
)
def bench_slow(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    """One child printing a..b slowly into a file, checkpointing on the default schedule."""
    sink = Path(os.environ["DTASK_BENCH_SINK"]) / f"{ctx.run_id}.txt"
    with sink.open("a") as out:
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            out.write(f"{i}\n")
            out.flush()


@dtask.template(
    "bench_noop",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=1),
)
def bench_noop(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """A trivial child: the fan-out benchmarks measure dtask's own cost around it."""


@dtask.template(
    "bench_sleep",
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=1, carry=("delay",)),
)
def bench_sleep(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    """A child that takes ``delay`` seconds: the scheduling plots watch who starts when."""
    time.sleep(delay)


@dtask.template(
    "bench_one",
    skeleton={"start": 1, "end": 1},
    split=dtask.RangeSplit("start", "end", chunk=1),
)
def bench_one(ctx: dtask.ChildContext, a: int, b: int) -> None:
    """One child of 1 ms per run: bench.small_runs submits many small runs of it."""
    time.sleep(0.001)
