"""The execution cap (issue 15, hole 8): an attempt that runs longer than its cap is stopped at
its next step, or its pool process is killed when it does not stop; either way the attempt is
counted as failed, retried from its checkpoint, and the worker goes on taking work."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import dtask
from tests.acceptance.test_faults import broker_env  # noqa: F401  (the fixture, both brokers)
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def worker(broker_env: dict[str, str], tmp_path: Path) -> Iterator[WorkerProcess]:  # noqa: F811
    env = {**broker_env, "DTASK_EXECUTION_CAP_GRACE": "1"}
    one = WorkerProcess(env, tmp_path / "w.log", "-c", "1")
    try:
        one.wait_ready()
        yield one
    finally:
        one.stop()


def submit(env: dict[str, str], template: str, *options: str, **variables: object) -> int:
    args = [a for name, value in variables.items() for a in ("-e", f"{name}={value}")]
    result = subprocess.run(
        [DTASK, "submit", template, *args, *options, "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return int(json.loads(result.stdout)["id"])


def attempts(sink: Path, run_id: int) -> list[tuple[int, int, int]]:
    """(attempt, checkpoint it started from, pid) per attempt of the run's child 0."""
    lines = (sink / f"{run_id}-0.txt").read_text().splitlines()
    found = [line.split() for line in lines if line.startswith("attempt ")]
    return [(int(w[1]), int(w[3]), int(w[5])) for w in found]


def items(sink: Path, run_id: int) -> list[int]:
    lines = (sink / f"{run_id}-0.txt").read_text().splitlines()
    return [int(line) for line in lines if line.isdigit()]


def pool_pids(worker: WorkerProcess) -> set[int]:
    return {p.pid for p in psutil.Process(worker.proc.pid).children()}


@pytest.mark.parametrize(
    ("template", "options", "how"),
    [
        ("hangs", ("--execution-cap", "2"), "cooperative"),  # the run's cap
        ("hangs_capped", (), "blocking"),  # the template's cap (2 s)
    ],
)
def test_an_attempt_over_its_execution_cap_fails_and_retries_from_its_checkpoint(
    worker: WorkerProcess,
    broker_env: dict[str, str],  # noqa: F811
    sink: Path,
    template: str,
    options: tuple[str, ...],
    how: str,
) -> None:
    pool_before = pool_pids(worker)
    run_id = submit(broker_env, template, *options, n=8, hang_at=5, how=how)
    status = dtask.get_run(run_id).wait(timeout=90)

    assert status.state is dtask.RunState.FAILED
    assert status.error is not None
    assert "exceeded its execution cap of 2 s" in status.error, status.error
    assert "gave up after 2 attempt(s)" in status.error
    assert children(run_id) == [(0, "failed", 2)]
    tried = attempts(sink, run_id)
    assert [(a, start) for a, start, _ in tried] == [(1, 0), (2, 4)]  # attempt 2 resumed at 4
    assert items(sink, run_id) == [1, 2, 3, 4]  # nothing redone, nothing after the hang
    if how == "blocking":
        assert "its process was killed" in status.error
        assert tried[0][2] != tried[1][2], "the killed pool process was replaced"
        killed = {pid for _, _, pid in tried}  # the run fails before its pool replaces them
        wait_for(lambda: not killed & pool_pids(worker), 60, "the killed pool processes gone")
    else:
        assert "process was killed" not in status.error
        assert pool_pids(worker) == pool_before, "a cooperative child's process lives on"

    # the worker stays healthy and takes new work
    after = submit(broker_env, "slow_range", n=20, delay=0)
    done = dtask.get_run(after).wait(timeout=60)
    assert done.state is dtask.RunState.SUCCEEDED, done.error
    assert worker.proc.poll() is None


def test_cancel_terminate_stops_a_hung_child_within_seconds(
    worker: WorkerProcess,
    broker_env: dict[str, str],  # noqa: F811
    sink: Path,
) -> None:
    pool_before = pool_pids(worker)
    run_id = submit(broker_env, "hangs", n=8, hang_at=5, how="blocking")  # no cap: hangs an hour
    wait_for(lambda: items(sink, run_id) == [1, 2, 3, 4], 60, "the child to hang at 5")
    asked = time.monotonic()
    cancelled = subprocess.run(
        [DTASK, "cancel", str(run_id), "--terminate", "--json"],
        env=broker_env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    # released as a cancel releases: back to pending, its attempt given back (a rerun resumes)
    wait_for(lambda: children(run_id) == [(0, "pending", 0)], 30, "the child released")
    hung = {pid for _, _, pid in attempts(sink, run_id)}
    wait_for(lambda: not hung & pool_pids(worker), 30, "the hung pool process gone")
    took = time.monotonic() - asked
    print(f"\nhung child stopped {took:.1f} s after cancel --terminate")
    assert took < 15, f"{took:.1f} s"
    assert pool_pids(worker) != pool_before, "the pool replaced the killed process"
    after = submit(broker_env, "slow_range", n=20, delay=0)
    assert dtask.get_run(after).wait(timeout=60).state is dtask.RunState.SUCCEEDED
