"""Templates the soak loads into its workers (DTASK_TEMPLATES=soak.templates).

A child appends ``s <attempt>`` when it starts and then each number of its range, one a line,
to DTASK_SOAK_SINK/<run>-<index>.txt: the checks read coverage, re-prints and executions there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dtask

CHUNK = 50
MAX_ATTEMPTS = 5


def sink_file(run_id: int, index: int) -> Path:
    return Path(os.environ["DTASK_SOAK_SINK"]) / f"{run_id}-{index}.txt"


@dtask.template(
    "soak_range",
    stealable=False,  # the verdict checks each child's own range (soak/checks.py)
    params={"n": int, "delay": float},
    skeleton={"start": 1, "end": "${n}", "delay": "${delay}"},
    split=dtask.RangeSplit("start", "end", chunk=CHUNK, carry=("delay",)),
    max_attempts=MAX_ATTEMPTS,
    checkpoint_every=10,
    checkpoint_interval=3600,
)
def soak_range(ctx: dtask.ChildContext, a: int, b: int, delay: float) -> None:
    with sink_file(ctx.run_id, ctx.index).open("a") as out:
        out.write(f"s {ctx.attempt}\n")
        out.flush()
        for i in ctx.resume(range(a, b + 1)):
            time.sleep(delay)
            out.write(f"{i}\n")
            out.flush()


class SoakSplitError(Exception):
    """Raised by a user's split: the run must fail with it, nothing else may notice."""


def _split_that_raises(rendered: dict[str, int]) -> list[dict[str, int]]:
    raise SoakSplitError(f"user split raised on n={rendered['n']}")


@dtask.template(
    "soak_broken_split", params={"n": int}, skeleton={"n": "${n}"}, split=_split_that_raises
)
def soak_broken_split(ctx: dtask.ChildContext, n: int) -> None:
    """Never runs: its split raises."""
