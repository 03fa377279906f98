"""Async children on real workers (issue 43): an ``async def`` child killed mid-run resumes
from its checkpoint on another worker; its execution cap cancels it where it awaits; a
stopping worker hands it over."""

from __future__ import annotations

import os
import signal
from functools import partial
from pathlib import Path

import psutil
import pytest

import dtask
from soak.cluster import FAST
from tests.acceptance.test_scale import handed_over, held
from tests.conftest import StartWorker, WorkerProcess
from tests.support.db import child_row, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def start_worker(start_worker: StartWorker) -> StartWorker:
    return partial(start_worker, "-c", "2", **FAST)


def lines(sink: Path, run_id: int, index: int) -> list[str]:
    return (sink / f"{run_id}-{index}.txt").read_text().splitlines()


def items(sink: Path, run_id: int, index: int) -> list[int]:
    return [int(line) for line in lines(sink, run_id, index) if line.isdigit()]


def attempts(sink: Path, run_id: int, index: int) -> list[tuple[int, int, int]]:
    """(attempt, checkpoint it started from, pid) per attempt of the child."""
    found = [w.split() for w in lines(sink, run_id, index) if w.startswith("attempt ")]
    return [(int(w[1]), int(w[3]), int(w[5])) for w in found]


def checkpointed(run_id: int, done: int) -> bool:
    return all((child_row(run_id, i).checkpoint or {}).get("done", 0) >= done for i in (0, 1))


def resumed_once(sink: Path, run_id: int) -> None:
    """Each child's every number seen, those its checkpoint held (the first five) once: its
    second attempt started from that checkpoint; the item in flight is done again."""
    for index in (0, 1):
        first = index * 20 + 1
        seen = items(sink, run_id, index)
        assert set(seen) == set(range(first, first + 20)), seen
        assert [seen.count(i) for i in range(first, first + 5)] == [1] * 5, seen
        assert [start for _, start, _ in attempts(sink, run_id, index)] == [0, 5]


def test_an_async_child_killed_mid_run_resumes_from_its_checkpoint(
    start_worker: object, sink: Path
) -> None:
    killed = start_worker()  # type: ignore[operator]
    hold = held(sink)  # each child awaits past its 6th item (5 checkpointed) until released
    run = dtask.submit("async_range", {"n": 40, "delay": 0.02, "hold": hold.name})
    wait_for(lambda: checkpointed(run.id, 5), 60, "both children to checkpoint 5 items")
    start_worker()  # type: ignore[operator]
    os.killpg(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait(10)
    hold.unlink()

    assert run.get(timeout=120) == sum(range(1, 41))  # each child's sum, reduced
    resumed_once(sink, run.id)
    gone = {pid for i in (0, 1) for _, _, pid in attempts(sink, run.id, i)[:1]}
    assert not gone & {pid for i in (0, 1) for _, _, pid in attempts(sink, run.id, i)[1:]}


def test_the_execution_cap_cancels_an_async_child_where_it_awaits(
    start_worker: object, sink: Path
) -> None:
    worker = start_worker("-c", "1")  # type: ignore[operator]
    run = dtask.submit("async_hangs_capped", {"n": 8, "hang_at": 5, "how": "await"})
    status = run.wait(timeout=120)

    assert status.state is dtask.RunState.FAILED
    assert status.error is not None
    assert "exceeded its execution cap of 2 s" in status.error, status.error
    assert "gave up after 2 attempt(s)" in status.error
    assert "process was killed" not in status.error  # cancelled, not killed
    tried = attempts(sink, run.id, 0)
    assert [(a, start) for a, start, _ in tried] == [(1, 0), (2, 4)]  # attempt 2 resumed at 4
    assert tried[0][2] == tried[1][2], "one pool process ran both attempts: none was killed"
    assert items(sink, run.id, 0) == [1, 2, 3, 4]
    assert tried[0][2] in {p.pid for p in _pool(worker)}


def test_a_stopping_worker_hands_its_async_children_over(start_worker: object, sink: Path) -> None:
    leaving = start_worker()  # type: ignore[operator]
    hold = held(sink)  # slow enough items that the resumed children are seen running
    run = dtask.submit("async_range", {"n": 40, "delay": 0.3, "hold": hold.name})
    wait_for(lambda: checkpointed(run.id, 5), 60, "both children to checkpoint 5 items")
    staying = start_worker()  # type: ignore[operator]

    leaving.proc.send_signal(signal.SIGTERM)  # a deploy's: the main process only
    assert leaving.proc.wait(30) == 0
    hold.unlink()
    for index in (0, 1):
        handed_over(staying, run.id, index)

    assert run.get(timeout=120) == sum(range(1, 41))
    resumed_once(sink, run.id)
    for index in (0, 1):
        assert child_row(run.id, index).attempt == 1  # a hand-over is not a failed attempt
    assert "stopped at its checkpoint and was released" in leaving.output()


def _pool(worker: WorkerProcess) -> list[psutil.Process]:
    return list(psutil.Process(worker.proc.pid).children())
