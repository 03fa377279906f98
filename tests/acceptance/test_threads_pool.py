"""`dtask worker -P threads` (Celery's threads pool, common for I/O-bound children) holds to
what prefork does: children checkpoint and renew their leases from threads, a SIGKILLed worker's
children resume elsewhere from their checkpoints, SIGTERM hands them over, and the execution
cap fails an attempt that will not stop (its thread cannot be killed: it runs on, fenced out,
until its code returns). Green pools are refused in one line."""

from __future__ import annotations

import itertools
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest

import dtask
from soak.cluster import FAST
from tests.acceptance.test_scale import held, numbers
from tests.conftest import DTASK, StartWorker, WorkerProcess
from tests.support.db import child_row, children, owner_pid, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def start(start_worker: StartWorker) -> StartWorker:
    return partial(start_worker, **FAST)


def held_on(worker: WorkerProcess, run_id: int, count: int) -> dict[int, int]:
    """Once each of the run's ``count`` children runs on ``worker`` (its threads are its main
    process) with 5 items checkpointed: their checkpoints."""

    def ready() -> dict[int, int] | None:
        rows = [child_row(run_id, i) for i in range(count)]
        on = all(r.state == "running" and r.owner and owner_pid(r.owner) == worker.proc.pid
                 for r in rows)  # fmt: skip
        done = {i: (r.checkpoint or {}).get("done", 0) for i, r in enumerate(rows)}
        return done if on and all(d >= 5 for d in done.values()) else None

    return dict(wait_for(ready, 60, f"{count} children checkpointed on the threads worker"))


def test_a_sigkilled_threads_worker_s_children_resume_elsewhere_from_their_checkpoints(
    start: StartWorker, sink: Path
) -> None:
    threads = start("-P", "threads", "-c", "4")
    gate = held(sink)
    run = dtask.submit("held_range", {"n": 80, "delay": 0.05, "hold": gate.name})  # 4 children
    done = held_on(threads, run.id, 4)
    start("-c", "2")  # prefork: where they resume
    threads.kill()
    gate.unlink()
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert children(run.id) == [(i, "succeeded", 2) for i in range(4)]
    for index in range(4):
        seen = numbers(sink, run.id, index)
        lo = index * 20 + 1
        assert set(seen) == set(range(lo, lo + 20))
        restarts = [b for a, b in itertools.pairwise(seen) if b <= a]
        assert restarts and all(r >= lo + done[index] for r in restarts), (index, restarts)


def test_sigterm_hands_a_threads_worker_s_children_over_at_their_checkpoints(
    start: StartWorker, sink: Path
) -> None:
    threads = start("-P", "threads", "-c", "2")
    gate = held(sink)
    run = dtask.submit("held_range", {"n": 40, "delay": 0.2, "hold": gate.name})  # 2 children
    held_on(threads, run.id, 2)
    start("-c", "2")
    threads.proc.send_signal(signal.SIGTERM)
    assert threads.proc.wait(20) == 0
    gate.unlink()
    status = run.wait(timeout=90)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    for index in range(2):
        seen = numbers(sink, run.id, index)
        assert sorted(seen) == list(range(index * 20 + 1, index * 20 + 21))  # nothing redone
        assert child_row(run.id, index).attempt == 1  # a hand-over is not a failed attempt
    assert "stopped at its checkpoint and was released" in threads.output()


def test_the_cap_fails_a_threads_child_that_will_not_stop_and_the_worker_goes_on(
    start: StartWorker, sink: Path, dtask_env: dict[str, str]
) -> None:
    threads = start("-P", "threads", "-c", "2", DTASK_EXECUTION_CAP_GRACE="1")
    stuck = dtask.submit("hangs_capped", {"n": 8, "hang_at": 5, "how": "blocking"})
    status = stuck.wait(timeout=90)
    assert status.state is dtask.RunState.FAILED
    assert "exceeded its execution cap of 2 s" in (status.error or "")
    assert children(stuck.id) == [(0, "failed", 2)]
    assert "cannot be ended outside a prefork pool process" in threads.output()
    assert threads.proc.poll() is None
    # both threads still sleep in the stuck code; a prefork worker takes the next run
    start("-c", "1")
    after = dtask.submit("print_range", {"n": 3})
    assert after.wait(timeout=60).state is dtask.RunState.SUCCEEDED


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_pool_is_refused_in_one_line(dtask_env: dict[str, str], pool: str) -> None:
    refused = subprocess.run(
        [DTASK, "worker", "-P", pool], env=dtask_env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip()
    assert line == (
        f"dtask worker: -P {pool} cannot run dtask's children (their heartbeats and PostgreSQL"
        " calls block the hub, so a busy child would lose its lease): use -P prefork (the"
        " default) or -P threads"
    ), line
