"""The sample templates, always loaded: print_range prints the numbers 1..n (each child its
own range a..b); sum_squares adds up their squares (each child returns its part, reduce sums)."""

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


@dtask.template(
    "sum_squares",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=1000),
    reduce=sum,  # the children's partial sums, in index order -> the run's result
)
def sum_squares(ctx: dtask.ChildContext, a: int, b: int) -> int:
    """1² + 2² + ... + n², each child its own range: its return value is its partial sum."""
    return sum(i * i for i in range(a, b + 1))
