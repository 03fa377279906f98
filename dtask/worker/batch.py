"""``dtask.children``: several short children of one run in one message (the dispatcher packs
them when the run's children take less than ``BATCH_SECONDS`` each, docs/benchmarks.md).

One pool process runs them one after the other, each exactly as ``dtask.child`` runs one:
claimed under its own lease and fence, checkpointed, finished, counted. Only the message is
shared: a child whose attempt fails, or that meets an unreachable PostgreSQL, is sent again
in a message of its own; one that is refused (finished, running elsewhere, its run cancelled)
is skipped; on a drain the children not started yet are handed over. A worker killed
mid-message has the whole message redelivered, and the children it had finished are refused
as finished.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.db import Redispatch
from dtask.domain.templates import registry
from dtask.exceptions import ChildFailed
from dtask.worker import drain
from dtask.worker.dispatch import CHILDREN, publish
from dtask.worker.tasks import (
    dtask_task,
    finalize_if_last,
    note_time,
    run_child,
    template_backoff,
)

log = logging.getLogger("dtask.worker")


class Resent(Exception):
    """The child went back to the broker in a message of its own."""


class InBatch:
    """A child's delivery inside a batch: a retry is a ``dtask.child`` message of its own."""

    retries = 0

    def __init__(self, child: Redispatch) -> None:
        self.child = child

    def retry(self, countdown: float, exc: BaseException | None = None) -> NoReturn:
        publish([self.child], countdown=countdown)
        raise Resent()

    def ended(self) -> None:
        """The batch's message gets its own final event."""


@dtask_task(CHILDREN, bind=True, max_retries=None, track_started=False, ignore_result=True)
def children(
    self: Task,
    run_id: int,
    template: str,
    group_id: str,
    queue: str | None,
    items: list[list[Any]],
) -> None:
    """Run ``items`` ([index, spec] pairs) of ``run_id`` in order, each as ``dtask.child``."""
    drain.arm()
    try:
        if template not in registry:  # a rolling deploy: the whole message waits elsewhere
            raise self.retry(countdown=template_backoff(self.request.retries), max_retries=None)
        took: list[float] = []
        for position, (index, spec) in enumerate(items):
            if drain.DRAINING.is_set():
                rest = [
                    Redispatch(run_id, i, s, template, group_id, queue) for i, s in items[position:]
                ]
                publish(rest)
                log.info("run %s: %s children handed over unstarted", run_id, len(rest))
                break
            child = Redispatch(run_id, int(index), spec, template, group_id, queue)
            try:
                seconds = run_child(InBatch(child), run_id, child.index, template, spec, False)
            except (Ignore, ChildFailed, Resent):
                continue
            if seconds is not None:
                took.append(seconds)
        if took:
            note_time(run_id, sum(took) / len(took))
            finalize_if_last(services.store(), run_id)
    finally:
        if drain.DRAINING.is_set():
            drain.leave()
