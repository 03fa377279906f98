"""An idle cluster's cost does not grow with its workers' passes: with nothing to dispatch,
the whole cluster runs one dispatcher pass per ten dispatch intervals (a slot in
``dtask_leases``), not one per worker (docs/scaling.md, "Capacity model"). Counted from what
each worker's loops log at shutdown; a busy machine only makes the passes fewer."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance

PASSES = re.compile(r"dispatcher loop: (\d+) passes, (\d+) not refused the turn")


def test_idle_workers_share_one_dispatcher_pass_per_slow_interval(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    began = time.monotonic()  # no pass before this: the span counted is at least theirs
    workers = [WorkerProcess(dtask_env, tmp_path / f"w{i}.log", "-c", "1") for i in range(4)]
    try:
        for worker in workers:
            worker.wait_ready()
        time.sleep(6)  # the quantity measured: passes over a stretch of idle time
    finally:
        for worker in workers:
            worker.stop()
    idle = time.monotonic() - began
    counts = [PASSES.search(w.output()) for w in workers]
    assert all(counts), [w.output()[-2000:] for w in workers]
    tried = sum(int(m[1]) for m in counts if m)
    passed = sum(int(m[2]) for m in counts if m)
    # each worker asks at the slow pace (0.5 s): about 2 a second each; the cluster passes
    # about 2 a second in all, one per worker more where a worker's first ask meets a slot
    # nobody took
    print(f"\n{len(workers)} idle workers, {idle:.1f} s: {tried} asked, {passed} passed")
    assert passed <= 2 * idle + 2 * len(workers) + 4, (tried, passed)
    assert tried >= passed
