"""Single submits' runs are picked up from PostgreSQL where the broker is Redis
(dtask/worker/pickup.py): a burst of submits sends a few ``dtask.pickup`` messages and their
masters go several runs to a message; a pickup lost with the broker leaves its runs to the
next one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import dtask
from dtask import services
from dtask.domain.runs import RunState
from dtask.worker import configure
from dtask.worker.config import DEFAULT_QUEUE
from tests.acceptance.test_bulk_masters import finished, messages_to_run_once, ran, received
from tests.acceptance.test_celery_app import CeleryWorker, in_project, numbers, project_env
from tests.acceptance.test_celery_app import finished as host_finished
from tests.conftest import WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

ONE = {"n": 1, "fail_every": 0}


@pytest.fixture(autouse=True)
def pickup(settings_from: Callable[[dict[str, str]], None]) -> None:
    settings_from({"DTASK_PICKUP": "1"})  # this process's submits: workers need nothing


def test_single_submits_are_picked_up_several_runs_to_a_message(
    workers: list[WorkerProcess], sink: Path
) -> None:
    dtask.submit("tiny", ONE).wait(timeout=60)
    submit = lambda: [dtask.submit("tiny", ONE).id for _ in range(300)]  # noqa: E731
    sent = messages_to_run_once(workers, sink, submit, 120)
    print(f"\n300 single submits: {dict(sent)}")
    # one submit after another, here: a pickup often finds one or two runs, sent as a
    # dtask.master message; under load it finds more (docs/benchmarks.md, "many small runs")
    assert sent["dtask.pickup"] > 0, sent
    assert sent["dtask.master"] + sent["dtask.masters"] < 300 / 2, sent


def test_runs_whose_pickup_was_lost_start_with_the_next_one(
    dtask_env: dict[str, str], sink: Path, tmp_path: Path
) -> None:
    lost = [dtask.submit("tiny", ONE).id for _ in range(5)]  # no worker yet: one pickup asked
    with configure().connection_for_write() as conn:  # the broker loses it, and the ask
        conn.default_channel.queue_purge(DEFAULT_QUEUE)
        conn.default_channel.client.delete(f"{DEFAULT_QUEUE}.pickup")
    worker = WorkerProcess(dtask_env, tmp_path / "w.log", "-c", "2")
    try:
        worker.wait_ready()
        ids = [*lost, dtask.submit("tiny", ONE).id]
        # well within DTASK_STALL_TIMEOUT: the next submit's pickup, not the reaper
        wait_for(lambda: finished(ids).get("succeeded") == 6, 60, "the 6 runs to succeed")
        assert ran(sink, ids) == Counter(dict.fromkeys(ids, 1))
        assert received([worker])["dtask.master"] == 0
    finally:
        worker.stop()


def test_a_host_apps_plain_worker_picks_up_the_runs_its_web_process_submitted(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """The Django-shaped project (tests/celery_project): `celery -A proj worker` with no -Q,
    and runs submitted with ``.delay()`` by another process of the project."""
    env = {**project_env(dtask_env, tmp_path, None, 10), "DTASK_PICKUP": "1"}
    worker = CeleryWorker(env, tmp_path / "host.log", "-c", "2").wait_ready()
    try:
        code = (
            "from proj.tasks import proj_range\n"
            "print(' '.join(str(proj_range.delay(n=1, delay=0).id) for _ in range(100)))"
        )
        ids = [int(i) for i in in_project(env, code).split()]
        wait_for(lambda: all(host_finished(i) for i in ids), 120, "100 runs to finish")
        assert {services.store().runs.status(i).state for i in ids} == {RunState.SUCCEEDED}
        assert all(numbers(tmp_path, i) == [1] for i in ids)  # each child ran once
        assert "picked up" in worker.output()
        assert "Received unregistered task" not in worker.output()
    finally:
        worker.stop()
