"""Short children go several to a message (dtask.children), and each is still claimed,
retried, counted and recovered on its own: a failing attempt is retried alone, a worker
killed or drained in the middle of a message loses no child and spends no attempt of a child
it never started (a message's children are claimed together, in one commit)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

import dtask
from dtask.domain.dispatch import MAX_BATCH
from tests.conftest import WorkerProcess
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


def written(sink: Path, run_id: int) -> Counter[int]:
    path = sink / f"{run_id}.tiny"
    lines = path.read_text().split() if path.exists() else []
    return Counter(int(i) for i in lines[::2])


def messages(workers: list[WorkerProcess]) -> Counter[str]:
    """Celery's "Task <name>[id] received" lines of dtask's children, by task name."""
    logs = "".join(w.output() for w in workers)
    return Counter(re.findall(r"Task (dtask\.child(?:ren)?)\[[^\]]+\] received", logs))


def test_short_children_go_several_to_a_message_and_each_runs_once(
    workers: list[WorkerProcess], sink: Path
) -> None:
    before = messages(workers)
    run = dtask.submit("tiny", {"n": 3000, "fail_every": 0})
    status = run.wait(timeout=180)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert status.children.succeeded == 3000
    assert written(sink, run.id) == Counter(range(3000))
    sent = messages(workers) - before
    assert sent["dtask.children"] > 0, sent
    assert sent["dtask.child"] + sent["dtask.children"] <= 3000 / 3, sent
    assert {attempt for _, _, attempt in children(run.id)} == {1}


def test_a_child_failing_inside_a_batch_is_retried_alone(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.submit("tiny", {"n": 2000, "fail_every": 250})
    status = run.wait(timeout=180)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert written(sink, run.id) == Counter(range(2000))
    attempts = {index: attempt for index, _, attempt in children(run.id)}
    assert {i for i, a in attempts.items() if a == 2} == set(range(0, 2000, 250))
    assert {a for i, a in attempts.items() if i % 250} == {1}


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "drained"])
def test_a_worker_stopped_in_the_middle_of_batches_loses_no_child(
    dtask_env: dict[str, str], sink: Path, tmp_path: Path, how: signal.Signals
) -> None:
    started = [WorkerProcess(dtask_env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    try:
        for w in started:
            w.wait_ready()
        run = dtask.submit("tiny", {"n": 6000, "fail_every": 0})
        wait_for(lambda: run.status().children.succeeded >= 1500, 120, "1,500 children done")
        assert messages(started)["dtask.children"] > 0
        os.killpg(started[0].proc.pid, how)
        started[0].proc.wait(60)
        stopped_at = time.monotonic()
        status = run.wait(timeout=240)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        seen = written(sink, run.id)
        assert set(seen) == set(range(6000))
        # a killed pool process's message runs again from its first child whose success was
        # not written yet: at most a message's children each (batch.Held); a drain writes
        # them before it hands the rest over
        again = sum(seen.values()) - 6000
        assert again <= (2 * MAX_BATCH if how is signal.SIGKILL else 0), seen.most_common(3)
        # a message's children are claimed together, but an attempt counts only once a child
        # starts (or, taken for the first time, as it ends): the stopped worker spent at most
        # the attempt of the child each of its two pool processes was running (a drain too:
        # SIGTERM between two tasks ends a pool process as billiard's handler does)
        spent = [(i, attempt) for i, _, attempt in children(run.id) if attempt > 1]
        assert len(spent) <= 2, spent
        print(f"\nrecovered {time.monotonic() - stopped_at:.1f} s after the {how.name}")
    finally:
        for w in started:
            w.stop()


def test_a_pool_process_sigtermed_alone_mid_run_leaves_and_loses_no_child(
    dtask_env: dict[str, str], sink: Path, tmp_path: Path
) -> None:
    """SIGTERM to the pool process alone while it runs messages of children (autoscale's
    shrink, an operator's kill; a group's SIGTERM before the main process says it is
    stopping): it hands over what it has not started, or finishes its child, and leaves; the
    pool starts another, and every child runs once (the decision itself: test_worker_scope)."""
    worker = WorkerProcess(dtask_env, tmp_path / "w.log", "-c", "1")
    try:
        worker.wait_ready()
        run = dtask.submit("tiny", {"n": 3000, "fail_every": 0})
        wait_for(lambda: run.status().children.succeeded >= 300, 120, "300 children done")
        [process] = psutil.Process(worker.proc.pid).children()
        process.terminate()
        status = run.wait(timeout=180)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        seen = written(sink, run.id)
        assert set(seen) == set(range(3000))
        assert sum(seen.values()) == 3000, seen.most_common(3)
        wait_for(lambda: not _alive(process), 30, "the pool process to leave")
        assert worker.proc.poll() is None
    finally:
        worker.stop()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
