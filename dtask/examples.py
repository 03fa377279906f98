"""The sample template, always loaded: print the numbers 1..n, each child its own range a..b."""

from __future__ import annotations

import dtask


@dtask.template(
    "print_range",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=1000),
)
def print_range(ctx: dtask.ChildContext, a: int, b: int) -> None:
    for i in ctx.resume(range(a, b + 1)):
        print(i)
