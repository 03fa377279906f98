"""SIGTERM to a pool process, ``revoke(terminate=True)`` and autoscale shrinking the pool
(issue 15, hole 6): each ends in a final state and no pool process keeps bouncing work."""

from __future__ import annotations

import threading
import time
from functools import partial

import psutil
import pytest

import dtask
from dtask import services
from dtask.db import Redispatch
from dtask.worker import configure
from dtask.worker.app import app
from dtask.worker.messages import publish
from tests.acceptance.test_faults import FAST, running_with_checkpoint
from tests.conftest import StartWorker, WorkerProcess
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def start_worker(start_worker: StartWorker) -> StartWorker:
    return partial(start_worker, **FAST)


def pool(worker: WorkerProcess) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(worker.proc.pid).children()]
    except psutil.NoSuchProcess:
        return []


def _status(pid: int) -> str:
    """A pool process's status; "gone" once it has left (between listing and asking)."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return "gone"


def succeeded_once_each(run: dtask.Run, timeout: float) -> list[tuple[int, str, int]]:
    status = run.wait(timeout=timeout)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    rows = children(run.id)
    assert rows == [(i, "succeeded", 1) for i in range(len(rows))]
    return rows


def test_an_idle_pool_process_that_ran_a_child_leaves_on_sigterm(start_worker: object) -> None:
    worker: WorkerProcess = start_worker("-c", "1")  # type: ignore[operator]
    succeeded_once_each(dtask.submit("slow_range", {"n": 20, "delay": 0}), 60)  # arms its handler
    [old] = pool(worker)

    psutil.Process(old).terminate()  # SIGTERM, as autoscale's shrink or an operator sends it
    wait_for(lambda: not psutil.pid_exists(old) or psutil.Process(old).status() == "zombie",
             20, "the pool process to leave")  # fmt: skip
    new = wait_for(lambda: [p for p in pool(worker) if p != old], 30, "a new pool process")
    print(f"\npool process {old} left on SIGTERM; the pool started {new}")

    succeeded_once_each(dtask.submit("slow_range", {"n": 60, "delay": 0}), 60)
    assert worker.proc.poll() is None


def test_revoke_with_terminate_fails_the_child_and_the_run(start_worker: object) -> None:
    worker: WorkerProcess = start_worker("-c", "2")  # type: ignore[operator]
    run = dtask.submit("slow_range", {"n": 60, "delay": 0.1})  # 3 children of 2 s
    wait_for(lambda: running_with_checkpoint(run.id, 0, 5), 30, "child 0 to checkpoint")
    group = services.store().runs.get(run.id).group_id
    configure()
    app.control.revoke(f"{group}.0", terminate=True)

    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.FAILED
    assert status.error is not None and "was revoked and terminated through Celery" in status.error
    assert children(run.id)[0][:2] == (0, "failed")
    assert [c[1] for c in children(run.id)[1:]] == ["succeeded", "succeeded"]

    succeeded_once_each(dtask.submit("slow_range", {"n": 40, "delay": 0}), 60)
    assert worker.proc.poll() is None


def test_revoke_of_a_waiting_child_fails_it_when_its_message_arrives(start_worker: object) -> None:
    start_worker("-c", "1")  # type: ignore[operator]
    run = dtask.submit("slow_range", {"n": 40, "delay": 0.15})  # 2 children of 3 s, one at a time
    wait_for(lambda: running_with_checkpoint(run.id, 0, 5), 30, "child 0 to checkpoint")
    group = services.store().runs.get(run.id).group_id
    configure()
    app.control.revoke(f"{group}.1")  # still in the broker: discarded when it is delivered

    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.FAILED
    assert status.error is not None and "child 1 was revoked through Celery" in status.error
    assert [c[:2] for c in children(run.id)] == [(0, "succeeded"), (1, "failed")]


def test_autoscale_grows_and_shrinks_the_pool_while_runs_go_on_and_loses_nothing(
    start_worker: object,
) -> None:
    worker: WorkerProcess = start_worker(  # type: ignore[operator]
        "--autoscale", "4,1", AUTOSCALE_KEEPALIVE="1"
    )
    sizes: list[tuple[float, int]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            alive = [p for p in pool(worker) if _status(p) not in ("zombie", "gone")]
            sizes.append((time.monotonic() - t0, len(alive)))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        long_run = dtask.submit("slow_range", {"n": 20, "delay": 2.5})  # 1 child of 50 s
        burst = dtask.submit("slow_range", {"n": 240, "delay": 0.05})  # 12 children of 1 s
        succeeded_once_each(burst, 90)
        grown = max(n for _, n in sizes)
        burst_done = time.monotonic() - t0
        wait_for(lambda: sizes[-1][1] <= 2, 30, "the pool to shrink while a run goes on")
        shrunk_at, shrunk_to = sizes[-1]
        assert long_run.status().state is dtask.RunState.RUNNING  # shrunk while runs go on
        second = dtask.submit("slow_range", {"n": 120, "delay": 0.05})  # 6 children of 1 s
        succeeded_once_each(second, 90)
        succeeded_once_each(long_run, 120)
    finally:
        stop.set()
        sampler.join(5)
    regrown = max(n for t, n in sizes if t > shrunk_at)
    print(
        f"\nautoscale 4,1: pool grew to {grown} during a 12-child burst (done at"
        f" {burst_done:.1f} s), shrank to {shrunk_to} at {shrunk_at:.1f} s while a 50 s child"
        f" ran, grew again to {regrown} for a 6-child run; every child succeeded on attempt 1"
    )
    assert grown >= 3
    assert regrown >= 2


def test_revoke_of_a_batch_message_fails_each_of_its_children(start_worker: object) -> None:
    """A ``dtask.children`` message is one task in Flower: revoking it is the user asking its
    children to stop for good, as revoking a child's own task id is."""
    start_worker("-c", "1", DTASK_DISPATCH_WINDOW="1")  # type: ignore[operator]
    run = dtask.submit("slow_range", {"n": 80, "delay": 0.1})  # 4 children of 2 s
    wait_for(lambda: running_with_checkpoint(run.id, 0, 5), 30, "child 0 to checkpoint")
    group = services.store().runs.get(run.id).group_id
    assert group is not None
    configure()
    answers = app.control.revoke(f"{group}.2+2", reply=True, timeout=10, limit=1)
    assert answers, "no worker acknowledged the revoke"
    taken: list[Redispatch] = []
    # a dispatcher's pass by hand: children 2 and 3 leave in one message (it has the turn)
    wait_for(lambda: _take(run.id, 2, taken), 30, "the dispatcher's turn")
    assert [c.index for c in taken] == [2, 3]
    publish(taken, batch=2)

    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.FAILED
    assert status.error is not None and "its message was revoked through Celery" in status.error
    assert [c[:2] for c in children(run.id)] == [
        (0, "succeeded"), (1, "succeeded"), (2, "failed"), (3, "failed"),
    ]  # fmt: skip


def _take(run_id: int, count: int, taken: list[Redispatch]) -> bool:
    with services.store().dispatch.turn() as turn:
        if turn is None:
            return False
        taken += [c for m in turn.take(run_id, count) for c in m]
        return True
