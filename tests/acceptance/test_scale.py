"""Scale-down is a hand-over: SIGTERM makes a worker give its running children away at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

import dtask
from tests.conftest import DTASK, StartWorker, WorkerProcess
from tests.support.db import child_row, owner_pid, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def start_worker(start_worker: StartWorker) -> StartWorker:
    return partial(start_worker, "-c", "2")


def runs_on(worker: WorkerProcess, run_id: int, index: int) -> bool:
    """Whether a pool process of ``worker`` holds the child and runs it."""
    row = child_row(run_id, index)
    return row.state == "running" and row.owner is not None and in_group(row.owner, worker)


def in_group(owner: str, worker: WorkerProcess) -> bool:
    try:
        return os.getpgid(owner_pid(owner)) == worker.proc.pid
    except ProcessLookupError:  # a process that is gone (the worker that left)
        return False


def handed_over(staying: WorkerProcess, run_id: int, index: int) -> None:
    """Once the leaving worker has exited, the child was handed over, not left to its lease:
    released (or already taken by the staying worker); then it resumes there, within a bound
    a busy machine meets (the exact hand-over time is bench.run's failover figure)."""
    row = child_row(run_id, index)
    assert row.owner is None or in_group(row.owner, staying), (
        f"child {index} is still {row.state}, held by {row.owner} of the worker that left"
    )
    wait_for(lambda: runs_on(staying, run_id, index), 60, f"child {index} to resume there")


def held(sink: Path) -> Path:
    """A hold for ``held_range``'s children (tests/support/templates.py)."""
    hold = sink / f"hold-{uuid.uuid4().hex}"
    hold.touch()
    return hold


def numbers(sink: Path, run_id: int, index: int) -> list[int]:
    return [int(x) for x in (sink / f"{run_id}-{index}.txt").read_text().split()]


@pytest.mark.parametrize("how", ["sigterm-main", "sigterm-group", "dtask-drain"])
def test_a_stopping_worker_hands_running_children_over_and_exits_at_once(
    start_worker: object, sink: Path, dtask_env: dict[str, str], how: str
) -> None:
    name = f"leaving-{how}@{socket.gethostname()}"
    leaving = start_worker("--hostname", name)  # type: ignore[operator]
    hold = held(sink)  # the children wait past their 6th item until the hand-over
    run = dtask.submit("held_range", {"n": 40, "delay": 0.5, "hold": hold.name})  # 2 children
    for index in (0, 1):
        wait_for(lambda i=index: (child_row(run.id, i).checkpoint or {}).get("done", 0) >= 5,
                 30, f"child {index} to checkpoint")  # fmt: skip
    staying = start_worker()  # type: ignore[operator]

    sent = time.monotonic()
    if how == "sigterm-group":
        os.killpg(leaving.proc.pid, signal.SIGTERM)
    elif how == "sigterm-main":
        leaving.proc.send_signal(signal.SIGTERM)
    else:
        drained = subprocess.run(
            [DTASK, "drain", name], env=dtask_env, capture_output=True, text=True, timeout=30
        )
        assert drained.returncode == 0, drained.stderr
    assert leaving.proc.wait(15) == 0
    exited_after = time.monotonic() - sent
    hold.unlink()
    print(f"\n[{how}] worker exited {exited_after:.2f} s after the request")
    assert exited_after < 10, f"worker took {exited_after:.1f} s to exit"

    for index in (0, 1):  # both handed over as the worker left, resumed on the other
        handed_over(staying, run.id, index)
    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    for index in (0, 1):
        seen = numbers(sink, run.id, index)
        assert set(seen) == set(range(index * 20 + 1, index * 20 + 21))
        assert len(seen) == len(set(seen))  # handed over at an exact checkpoint: nothing redone
        assert child_row(run.id, index).attempt == 1  # a hand-over is not a failed attempt
    assert "stopped at its checkpoint and was released" in leaving.output()


def test_a_stopping_worker_hands_over_a_one_child_run_its_master_runs(
    start_worker: object, sink: Path
) -> None:
    """The child of a run of one runs in its master's task (docs/scheduling.md); a drain hands
    it over from its checkpoint like any other, and its master's message is not run again."""
    leaving = start_worker()  # type: ignore[operator]
    hold = held(sink)
    run = dtask.submit("held_range", {"n": 20, "delay": 0.5, "hold": hold.name})  # 1 child
    wait_for(lambda: (child_row(run.id, 0).checkpoint or {}).get("done", 0) >= 5,
             30, "the child to checkpoint")  # fmt: skip
    staying = start_worker()  # type: ignore[operator]
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.proc.wait(15) == 0
    hold.unlink()
    handed_over(staying, run.id, 0)
    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen = numbers(sink, run.id, 0)
    assert sorted(seen) == list(range(1, 21))  # handed over at an exact checkpoint
    assert child_row(run.id, 0).attempt == 1


def test_a_child_that_ignores_the_drain_is_released_when_the_grace_period_ends(
    start_worker: object, sink: Path
) -> None:
    leaving = start_worker(DTASK_DRAIN_GRACE="2")  # type: ignore[operator]
    # 20 s, never checks should_stop(); still running once `staying` is up on a slow machine
    run = dtask.submit("stubborn", {"steps": 40})
    wait_for(lambda: child_row(run.id, 0).state == "running", 30, "the child to start")
    staying = start_worker()  # type: ignore[operator]
    assert child_row(run.id, 0).state == "running"
    sent = time.monotonic()
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.proc.wait(15) == 0
    assert time.monotonic() - sent < 10
    status = run.wait(timeout=90)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert "did not stop within the drain grace period" in leaving.output()
    assert staying.proc.poll() is None


def test_drain_names_an_unknown_worker_clearly(dtask_env: dict[str, str]) -> None:
    result = subprocess.run(
        [DTASK, "drain", "nobody@nowhere"], env=dtask_env, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert result.returncode == 2
    assert "no worker 'nobody@nowhere' answered" in result.stderr


def _owned_by(run_id: int, worker: WorkerProcess) -> bool:
    from sqlalchemy import text

    from dtask import services

    with services.store().engine.connect() as conn:
        owners = conn.execute(
            text("SELECT owner FROM dtask_children WHERE run_id = :r AND owner IS NOT NULL"),
            {"r": run_id},
        ).scalars()
        pids = [owner_pid(o) for o in owners]
    return any(_in_group(pid, worker.proc.pid) for pid in pids)


def _in_group(pid: int, group: int) -> bool:
    try:
        return os.getpgid(pid) == group
    except ProcessLookupError:
        return False


def test_workers_that_join_mid_run_take_children_within_2_seconds(start_worker: object) -> None:
    start_worker()  # type: ignore[operator]
    run = dtask.submit("slow_range", {"n": 4000, "delay": 0.025})  # 200 children of 0.5 s
    wait_for(lambda: run.status().children.succeeded >= 4, 30, "the run to get going")
    for _ in range(2):
        joined = start_worker()  # type: ignore[operator]
        ready = time.monotonic()
        wait_for(lambda w=joined: _owned_by(run.id, w), 10, "the new worker to take a child")
        took = time.monotonic() - ready
        print(f"\nworker joined; first child {took:.2f} s after it was ready")
        assert took < 2, f"the new worker took {took:.1f} s to start a child"
    run.cancel()


def test_a_split_by_slots_makes_a_child_a_live_slot(start_worker: object, sink: Path) -> None:
    """``RangeSplit(parts="slots")`` at concurrency 2: 2, 4, 6 children with 1, 2, 3 workers
    (and `dtask status` says how many slots the split saw)."""
    from dtask.client.workers import slots_for

    for workers in (1, 2, 3):
        start_worker()  # type: ignore[operator]
        wait_for(lambda n=workers: slots_for("dtask") == 2 * n, 30, f"{workers} workers live")
        run = dtask.submit("by_slots", {"n": 1000})
        status = run.wait(timeout=60)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        assert (status.children.total, status.slots) == (2 * workers, 2 * workers)
        done = sorted(n for i in range(2 * workers) for n in numbers(sink, run.id, i))
        assert done == list(range(1, 1001))
        shown = subprocess.run(
            [DTASK, "status", str(run.id)], capture_output=True, text=True, check=True
        ).stdout
        assert f"{2 * workers} live slots seen" in shown


def test_a_small_run_does_not_wait_behind_a_large_ones_backlog(start_worker: object) -> None:
    start_worker()  # type: ignore[operator]
    start_worker()  # type: ignore[operator]
    big = dtask.submit("slow_range", {"n": 100_000, "delay": 0.0025})  # 5,000 children of 0.05 s
    wait_for(lambda: big.status().children.succeeded >= 20, 60, "the large run to get going")
    submitted = time.monotonic()
    small = dtask.submit("slow_range", {"n": 200, "delay": 0.0025})  # 10 children
    wait_for(lambda: small.status().children.running + small.status().children.succeeded > 0,
             5, "the small run's first child to start")  # fmt: skip
    status = small.wait(timeout=30)
    assert status.state is dtask.RunState.SUCCEEDED
    small_took = time.monotonic() - submitted
    remaining = big.status().children
    print(
        f"\nsmall run done {small_took:.2f} s after submit;"
        f" large run {remaining.finished}/{remaining.total} children done by then"
    )
    assert remaining.finished < remaining.total / 2, "the small run should finish long before"
    assert small_took < 10
    big.cancel()


def test_a_templates_queue_routes_its_children_to_the_workers_consuming_it(
    start_worker: object, sink: Path
) -> None:
    plain = start_worker()  # type: ignore[operator]
    special = start_worker("-Q", "special")  # type: ignore[operator]
    run = dtask.submit("routed", {"n": 60})
    assert run.wait(timeout=60).state is dtask.RunState.SUCCEEDED
    pids = {int(p) for i in range(6) for p in (sink / f"{run.id}-{i}.txt").read_text().split()}
    assert all(_in_group(pid, special.proc.pid) for pid in pids)
    assert not any(_in_group(pid, plain.proc.pid) for pid in pids)


def test_autoscale_runs_children_within_its_bounds(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    worker = WorkerProcess(dtask_env, tmp_path / "auto.log", "--autoscale", "3,1")
    try:
        worker.wait_ready()
        run = dtask.submit("slow_range", {"n": 120, "delay": 0.05})  # 6 children of 1 s
        assert run.wait(timeout=60).state is dtask.RunState.SUCCEEDED
        import psutil

        assert len(psutil.Process(worker.proc.pid).children()) <= 3
    finally:
        worker.stop()
