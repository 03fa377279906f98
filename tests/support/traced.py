"""A template for the trace tests (tests/acceptance/test_traces.py), whose import installs the
test's span exporter where DTASK_TEST_TRACES asks for it (tests/support/traces.py)."""

from __future__ import annotations

import dtask
from tests.support.traces import install_from_env

install_from_env()


@dtask.template(
    "traced_range",
    stealable=False,
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    checkpoint_every=5,
    checkpoint_interval=3600,
)
def traced_range(ctx: dtask.ChildContext, a: int, b: int) -> int:
    total = 0
    for i in ctx.resume(range(a, b + 1)):
        total += i
    return total
