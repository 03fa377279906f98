"""A worker that cannot load a run's template leaves the run to workers that can (a rolling
deploy), and the run fails only when none took it within the bound, saying so."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtask import services, submit, submit_many
from dtask.domain.runs import RunState
from tests.conftest import WorkerProcess
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def without_the_template(
    request: pytest.FixtureRequest, dtask_env: dict[str, str], tmp_path: Path
) -> Iterator[WorkerProcess]:
    stall = request.param  # DTASK_STALL_TIMEOUT: the bound is 4 x this
    env = {**dtask_env, "DTASK_TEMPLATES": "", "DTASK_STALL_TIMEOUT": str(stall)}
    worker = WorkerProcess(env, tmp_path / "without.log", "-c", "1")
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()


def state(run_id: int) -> RunState:
    return services.store().runs.status(run_id).state


@pytest.mark.parametrize("without_the_template", [15], indirect=True)
def test_the_run_waits_for_a_worker_that_knows_its_template(
    without_the_template: WorkerProcess, dtask_env: dict[str, str], tmp_path: Path
) -> None:
    run = submit("slow_range", {"n": 20, "delay": 0.0})
    wait_for(lambda: "leaving its master to another worker" in without_the_template.output(),
             60, "the worker without the template to pass the master on")  # fmt: skip
    time.sleep(1)
    assert state(run.id) is RunState.PENDING
    knows = WorkerProcess(dtask_env, tmp_path / "knows.log", "-c", "1")
    try:
        knows.wait_ready()
        assert run.wait(timeout=60).state is RunState.SUCCEEDED
    finally:
        knows.stop()


@pytest.mark.parametrize("without_the_template", [15], indirect=True)
def test_a_bulk_submit_s_runs_wait_for_a_worker_that_knows_their_template(
    without_the_template: WorkerProcess, dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """Their masters share a dtask.masters message, which waits as one."""
    found = submit_many("slow_range", [{"n": 20, "delay": 0.0}] * 5)
    wait_for(lambda: "leaving them to another worker" in without_the_template.output(),
             60, "the worker without the template to pass the masters on")  # fmt: skip
    assert {state(s.run_id or 0) for s in found} == {RunState.PENDING}
    knows = WorkerProcess(dtask_env, tmp_path / "knows.log", "-c", "1")
    try:
        knows.wait_ready()
        wait_for(lambda: {state(s.run_id or 0) for s in found} == {RunState.SUCCEEDED},
                 60, "the runs to succeed")  # fmt: skip
    finally:
        knows.stop()


@pytest.mark.parametrize("without_the_template", [2], indirect=True)
def test_the_run_fails_when_no_worker_knew_its_template_within_the_bound(
    without_the_template: WorkerProcess,
) -> None:
    run = submit("slow_range", {"n": 20, "delay": 0.0})
    status = run.wait(timeout=90)
    assert status.state is RunState.FAILED
    assert f"no worker that took run {run.id} knows template 'slow_range'" in (status.error or "")
    assert "tried for 8 s" in (status.error or "")


@pytest.mark.parametrize("without_the_template", [15], indirect=True)
def test_children_are_left_unclaimed_to_workers_that_know_the_template(
    without_the_template: WorkerProcess, dtask_env: dict[str, str], tmp_path: Path
) -> None:
    knows = WorkerProcess(dtask_env, tmp_path / "knows.log", "-c", "1")
    try:
        knows.wait_ready()
        run = submit("slow_range", {"n": 200, "delay": 0.0})
        assert run.wait(timeout=120).state is RunState.SUCCEEDED
    finally:
        knows.stop()
    attempts = [attempt for _, _, attempt in children(run.id)]
    assert len(attempts) == 10 and set(attempts) == {1}  # no attempt spent on the other worker
    assert "does not know template 'slow_range'" in without_the_template.output()


def test_a_run_no_live_worker_can_run_does_not_hold_its_queue(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """The only worker that knew a running run's template dies, and the one that replaces it
    does not know it (a deploy took the template away): the run waits, and the queue's other
    runs go on (its children held the dispatcher's window, so nothing else was sent)."""
    env = {**dtask_env, "DTASK_STALL_TIMEOUT": "3"}
    knows = WorkerProcess(env, tmp_path / "knows.log", "-c", "2")
    try:
        knows.wait_ready()
        stranded = submit("slow_range", {"n": 4000, "delay": 0.05})  # 200 children of 1 s
        wait_for(
            lambda: sum(attempt > 0 for _, _, attempt in children(stranded.id)) >= 2,
            60,
            "children of the first run to start",
        )
    finally:
        knows.kill()
        knows.stop()  # closes its log
    without = WorkerProcess({**env, "DTASK_TEMPLATES": ""}, tmp_path / "without.log", "-c", "2")
    try:
        without.wait_ready()
        run = submit("sum_squares", {"n": 5000})
        status = run.wait(timeout=120)
        assert status.state is RunState.SUCCEEDED
        assert status.result == sum(i * i for i in range(1, 5001))
        assert state(stranded.id) is RunState.RUNNING  # waiting for a worker that knows it
    finally:
        stranded.cancel()
        without.stop()
