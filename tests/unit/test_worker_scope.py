"""Scoped policy (dtask/worker/scope.py): a worker of another Celery app than the adopted one is
left to Celery; a stopping worker's main process signals only the pool processes that run
dtask's children (dtask/worker/drain.py), leaving a host's own task to Celery's warm shutdown."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery import Celery
from celery.worker import state as worker_state

from dtask.worker import drain, events, scope, startup


class Request:
    """What the forward reads of a Celery request accepted by a pool process."""

    def __init__(self, name: str, pid: int) -> None:
        self.type, self.worker_pid = name, pid


@pytest.fixture
def pool() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = {name: subprocess.Popen(sleep) for name in ("dtask.child", "reports.slow_report")}
    requests = [Request(name, p.pid) for name, p in procs.items()]
    for request in requests:
        worker_state.active_requests.add(request)
    yield procs
    for request in requests:
        worker_state.active_requests.discard(request)
    for p in procs.values():
        p.kill()
        p.wait(10)
    drain._stopping[0] = 0


def test_the_shutdown_signals_only_pool_processes_running_dtasks_tasks(
    pool: dict[str, subprocess.Popen[bytes]],
) -> None:
    drain._forward_to_pool()
    assert pool["dtask.child"].wait(10) == -15
    assert pool["reports.slow_report"].poll() is None
    assert drain.stopping() and drain.draining()  # what the pool processes read from now on


def test_a_worker_of_another_app_gets_no_policy_of_dtasks() -> None:
    other = Celery("other", set_as_current=False)
    worker = SimpleNamespace(app=other)
    try:
        startup.before_start(  # Celery's celeryd_init, for `celery -A proj.other worker`
            sender="other@host", instance=worker, conf=other.conf,
            options={"prefetch_multiplier": 8},
        )  # fmt: skip
        assert not scope.this_worker()
    finally:
        scope._worker_app = None
    assert "dtask" not in other.amqp.queues
    assert events.BatchedEvents not in other.steps["consumer"]


@pytest.fixture
def pool_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[SimpleNamespace, list[str]]]:
    """This process as a pool process's SIGTERM handler sees it: the task it runs (None:
    idle) and what the handler did (``left``)."""
    app = SimpleNamespace(current_worker_task=None)
    did: list[str] = []
    monkeypatch.setattr(drain, "current", lambda: app)
    monkeypatch.setattr(drain, "leave", lambda: did.append("left"))
    yield app, did
    drain.DRAINING.clear()


@pytest.mark.parametrize("task", ["dtask.children", "dtask.master", "dtask.masters"])
def test_sigterm_between_two_children_hands_the_rest_over_even_before_the_worker_stops(
    pool_process: tuple[SimpleNamespace, list[str]], task: str
) -> None:
    """A process group's SIGTERM reaches the pool before the main process sets ``stopping``:
    leaving then lost the message's unstarted children with the process (they ran twice)."""
    app, did = pool_process
    app.current_worker_task = SimpleNamespace(name=task)
    assert not drain.stopping()
    drain._on_sigterm(15, None)
    assert drain.draining() and did == []


@pytest.mark.parametrize("task", [None, "reports.slow_report"])
def test_sigterm_to_an_idle_pool_process_or_a_hosts_task_leaves_at_once(
    pool_process: tuple[SimpleNamespace, list[str]], task: str | None
) -> None:
    app, did = pool_process
    app.current_worker_task = None if task is None else SimpleNamespace(name=task)
    drain._on_sigterm(15, None)
    assert did == ["left"] and not drain.draining()
