"""The master -> chord -> finalize path on Celery's in-process test worker (celery.contrib.pytest)
against the real embedded Redis and PostgreSQL: fast, no subprocess."""

from __future__ import annotations

import os
import queue
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import task_postrun

import dtask
from dtask import services
from dtask.worker.messages import child_task_id, chord_callback
from dtask.worker.tasks import child


@pytest.fixture(scope="module")
def celery_app(dtask_env: dict[str, str]) -> Iterator[Celery]:
    import celery.contrib.testing.tasks  # noqa: F401  (registers celery.ping for the fixture)

    from dtask.worker import configure, load
    from dtask.worker.dispatcher import Dispatcher
    from dtask.worker.loop import Loop

    load()
    app = configure()
    # What `dtask worker` does around its pool: report its slots, run a dispatcher loop.
    workers = services.store().workers
    workers.report("inprocess@test", ("dtask",), 1, os.getpid(), 0)
    loop = Loop("dispatcher", 0.05, Dispatcher().once)
    loop.start()
    try:
        yield app
    finally:
        loop.stop()
        workers.leave("inprocess@test")


@pytest.fixture(scope="module")
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": ("dtask",), "perform_ping_check": False}


def test_a_run_completes_through_the_chord_and_late_duplicates_change_nothing(
    celery_app: Celery, celery_worker: Any
) -> None:
    run = dtask.submit("print_range", {"n": 3500}, key=f"inproc-{uuid.uuid4()}")
    status = run.wait(timeout=30)
    assert status.state is dtask.RunState.SUCCEEDED
    assert status.children.succeeded == 4

    record = services.store().runs.get(run.id)
    assert record.group_id is not None
    # A late copy of a finished child: same id and chord options, as a redelivery would be.
    # A child stores no result (ignore_result): the in-process worker's task_postrun tells.
    ran: queue.Queue[tuple[str, Any]] = queue.Queue()
    late_id = child_task_id(record.group_id, 0)

    def finished(task_id: str = "", state: str = "", retval: Any = None, **_: Any) -> None:
        if task_id == late_id:
            ran.put((state, retval))

    task_postrun.connect(finished, weak=False)
    try:
        child.apply_async(
            args=(run.id, 0, "print_range", {"a": 1, "b": 1000}),
            task_id=late_id,
            group_id=record.group_id,
            group_index=0,
            chord=chord_callback(run.id, record.group_id),
        )
        assert ran.get(timeout=10) == ("SUCCESS", None)
    finally:
        task_postrun.disconnect(finished)
    after = run.status()
    assert after.state is dtask.RunState.SUCCEEDED
    assert after.children == status.children
    assert after.finished_at == status.finished_at
