"""End to end with real `dtask worker` processes on the embedded PostgreSQL and Redis."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

import dtask
from dtask import services
from dtask.domain.runs import NewRun
from dtask.worker import configure
from tests.conftest import DTASK, REPO, WorkerProcess, printed_numbers
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


def cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def sink_lines(sink: Path, run_id: int, index: int) -> list[str]:
    return (sink / f"{run_id}-{index}.txt").read_text().splitlines()


def test_print_range_100k_on_two_workers_prints_every_number_once(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    offsets = [len(w.output()) for w in workers]
    result = cli(dtask_env, "submit", "print_range", "-e", "n=100000", "--wait", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["state"] == "succeeded"
    assert status["children"] == {
        "total": 100, "pending": 0, "running": 0, "succeeded": 100, "failed": 0,
    }  # fmt: skip
    time.sleep(0.5)  # the last log lines may still be in flight
    numbers = Counter(
        n
        for w, offset in zip(workers, offsets, strict=True)
        for n in printed_numbers(w.output()[offset:])
    )
    assert set(numbers) == set(range(1, 100_001))
    assert max(numbers.values()) == 1
    both = [printed_numbers(w.output()[o:]) for w, o in zip(workers, offsets, strict=True)]
    assert all(both), "both workers should have run children"


def test_a_failing_child_retries_and_resumes_from_its_checkpoint(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.submit("flaky_range", {"n": 300, "fail_at": 150})
    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen = [int(x) for x in sink_lines(sink, run.id, 1)]
    assert set(seen) == set(range(101, 201))
    repeated = len(seen) - len(set(seen))
    assert 0 < repeated <= 10  # at most one checkpoint interval (checkpoint_every=10)
    restart = seen.index(149) + 1
    assert seen[restart] == 141  # resumed from the checkpoint, not from 101
    assert [(i, s, a) for i, s, a in children(run.id) if a != 1] == [(1, "succeeded", 2)]


def test_free_form_checkpoints_resume_where_they_left_off(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.registry.get("free_form").delay(steps=10)
    assert run.wait(timeout=60).state is dtask.RunState.SUCCEEDED
    assert sink_lines(sink, run.id, 0) == [str(i) for i in range(1, 11)]


def test_a_child_that_keeps_failing_fails_the_master_and_leaves_no_celery_results(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.submit("always_fails", {"n": 30, "bad": 15})
    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.FAILED
    assert status.children.succeeded == 2 and status.children.failed == 1
    assert status.error is not None
    assert "child 1: gave up after 3 attempt(s): ValueError: item 15 is poison" in status.error
    assert sink_lines(sink, run.id, 1) == ["attempt 1", "attempt 2", "attempt 3"]
    group = services.store().runs.get(run.id).group_id
    assert group is not None
    wait_for(lambda: not result_keys(group), 60, f"the result keys of {group} to go")


def test_a_finished_run_leaves_nothing_in_the_result_backend(workers: list[WorkerProcess]) -> None:
    """Children store no Celery result (PostgreSQL has the outcome) and the chord's own keys
    go when the run is finalized: nothing per child stays in Redis for result_expires."""
    run = dtask.submit("print_range", {"n": 500})  # 50 children
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    group = services.store().runs.get(run.id).group_id
    assert group is not None
    wait_for(lambda: not result_keys(group), 60, f"the result keys of {group} to go")
    cancelled = dtask.submit("slow_range", {"n": 400, "delay": 0.05})
    wait_for(lambda: cancelled.status().children.succeeded > 0, 60, "a child to finish")
    group = services.store().runs.get(cancelled.id).group_id
    assert group is not None
    cancelled.cancel()
    assert cancelled.wait(timeout=60).state is dtask.RunState.CANCELLED
    wait_for(lambda: not result_keys(group), 60, f"the result keys of {group} to go")


def result_keys(group: str) -> list[bytes]:
    """The result backend's keys for the chord ``group`` but its done marker, which expires
    within the hour (it turns a straggler's part into a no-op)."""
    client = configure().backend.client
    keys = list(client.scan_iter(match=f"*{group}*", count=1000))
    assert all(0 < client.ttl(k) <= 3600 for k in keys if k.endswith(b".c")), keys
    return [k for k in keys if not k.endswith(b".c")]


def test_one_run_per_key(dtask_env: dict[str, str], workers: list[WorkerProcess]) -> None:
    key = f"nightly-{uuid.uuid4()}"
    first = cli(dtask_env, "submit", "print_range", "-e", "n=10", "--key", key, "--json")
    second = cli(dtask_env, "submit", "print_range", "-e", "n=10", "--key", key, "--json")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert json.loads(first.stdout)["id"] == json.loads(second.stdout)["id"]
    assert json.loads(first.stdout)["key"] == key
    other = cli(dtask_env, "submit", "print_range", "-e", "n=11", "--key", key)
    assert other.returncode == 2
    assert "already triggered run" in other.stderr


def test_duplicated_master_messages_split_and_dispatch_once(
    workers: list[WorkerProcess], sink: Path
) -> None:
    app = configure()
    store = services.store()
    run_id, _ = store.runs.create(
        NewRun("flaky_range", f"dup-{uuid.uuid4()}", {"n": 500, "fail_at": 0}, 3, None)
    )
    for _ in range(3):
        app.send_task("dtask.master", args=(run_id,), ignore_result=True)
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED
    app.send_task("dtask.master", args=(run_id,), ignore_result=True)  # a late redelivery
    time.sleep(1)
    assert children(run_id) == [(i, "succeeded", 1) for i in range(5)]
    for index in range(5):
        assert sink_lines(sink, run_id, index) == [
            str(i) for i in range(index * 100 + 1, index * 100 + 101)
        ]
    assert dtask.get_run(run_id).status().state is dtask.RunState.SUCCEEDED


def test_status_and_runs_print_the_documented_json(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    run = dtask.submit("print_range", {"n": 5})
    run.wait(timeout=60)
    status = cli(dtask_env, "status", str(run.id), "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["id"] == run.id and data["state"] == "succeeded" and data["variables"] == {"n": 5}
    listed = cli(dtask_env, "runs", "--json")
    assert any(r["id"] == run.id for r in json.loads(listed.stdout))
    human = cli(dtask_env, "status", str(run.id))
    assert "succeeded" in human.stdout and "1 succeeded" in human.stdout
    watched = cli(dtask_env, "status", str(run.id), "--watch")
    assert watched.returncode == 0 and "1/1 children" in watched.stderr
