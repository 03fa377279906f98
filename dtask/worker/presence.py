"""This worker in `dtask_workers`: reported when it is ready and on every reaper pass, removed
when it shuts down. A worker killed without a word stops counting as live once it has not been
seen for ``Settings.worker_seen_within`` seconds (and is a `worker_lost` alert until it comes
back or the monitor forgets it)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from celery.signals import worker_ready, worker_shutting_down
from celery.worker import state as worker_state

from dtask import services
from dtask.db import WorkerInfo
from dtask.domain.dispatch import runnable
from dtask.domain.templates import registry
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.worker import scope

log = logging.getLogger("dtask.worker")
_me: tuple[str, tuple[str, ...], int] | None = None
_code: dict[str, int] | None = None  # its templates' module files as loaded (see code())
# A report (from the reaper's or the dispatcher's thread) racing the shutdown's removal would
# put the row back for a worker that is gone: both take this lock, and leaving ends reports.
_lock = threading.Lock()


def describe(consumer: Any) -> tuple[str, tuple[str, ...], int]:
    """(node name, queues consumed, child slots) of the worker whose consumer is ready."""
    queues = tuple(sorted(q.name for q in consumer.task_consumer.queues))
    controller = consumer.controller
    scaler = getattr(controller, "autoscaler", None)
    slots = int(scaler.max_concurrency if scaler is not None else controller.concurrency)
    return str(consumer.hostname), queues, slots


def code() -> dict[str, int]:
    """The files of the modules that define this worker's templates, with their modification
    times (ns) as it loaded them: `dtask status` says "workers run an older version of
    myjobs.py" when a run waits for a template they lack and a file changed since."""
    files: dict[str, int] = {}
    for template in registry.all():
        module = sys.modules.get(getattr(template.function, "__module__", "") or "")
        path = getattr(module, "__file__", None)
        if path and path not in files:
            with contextlib.suppress(OSError):
                files[path] = os.stat(path).st_mtime_ns
    return files


def busy() -> int:
    """Children this worker runs now: requests its pool has accepted and not finished."""
    return len(worker_state.active_requests)


def report() -> None:
    with _lock:
        if _me is not None:
            name, queues, slots = _me
            services.store().workers.report(
                name, queues, slots, os.getpid(), busy(), registry.names(), _code
            )


def _ready(sender: Any = None, **_: Any) -> None:
    global _me, _code
    if not scope.serves(getattr(sender, "app", None)):
        return  # another app's worker (dtask/worker/scope.py)
    with _lock:
        _me, _code = describe(sender), code()
    try:
        report()
    except Exception as exc:  # the next reaper pass reports again
        log.warning("could not report this worker to PostgreSQL yet: %s", exc)


def _leave(**_: Any) -> None:
    global _me
    with _lock:
        me, _me = _me, None
    if me is not None:
        try:
            services.store().workers.leave(me[0])
        except Exception as exc:  # it drops out by itself once not seen
            log.warning("could not remove this worker from PostgreSQL: %s", exc)


def install() -> None:
    worker_ready.connect(_ready, weak=False)
    worker_shutting_down.connect(_leave, weak=False)


def can_run(workers: list[WorkerInfo]) -> Callable[[str | None, str], bool]:
    """Whether a live worker of ``queue`` (None: the default) can run ``template``: the one
    test the dispatcher and the reaper apply before sending a run's children."""
    known: dict[str, list[tuple[str, ...] | None]] = {}
    for w in workers:
        for queue in w.queues:
            known.setdefault(queue, []).append(w.templates)

    def can(queue: str | None, template: str) -> bool:
        return runnable(template, known.get(queue or DEFAULT_QUEUE, []))

    return can
