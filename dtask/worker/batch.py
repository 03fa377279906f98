"""``dtask.children``: several short children of one run in one message (the dispatcher packs
them when the run's children take less than ``BATCH_SECONDS`` each, docs/benchmarks.md).

One pool process runs them one after the other, each exactly as ``dtask.child`` runs one:
checkpointed, finished, counted. A message the dispatcher sent is claimed as one row (one
lease and fence for its children, ``db/message_claims.py``), any other child by its own row.
Only the message is shared: a child whose attempt fails, or that meets an unreachable
PostgreSQL, is sent again in a message of its own; one that is refused (finished, running
elsewhere, its run cancelled) is skipped; on a drain the children not started yet are handed
over. Their successes are held and written together. A worker killed mid-message has the
children it had not written sent again: the message redelivered finds its claim taken (busy),
the reaper re-sends them once its lease expires.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Finished, Redispatch
from dtask.db.children import lease_lost
from dtask.domain.runs import RunState
from dtask.exceptions import ChildFailed, DatabaseUnavailable
from dtask.worker import drain, links, traces
from dtask.worker.child_store import Child, owner_name, patiently
from dtask.worker.finalize import finalize_if_last
from dtask.worker.messages import publish
from dtask.worker.received import Received, note_time, unclaim, unwritten_for
from dtask.worker.task_table import CHILDREN
from dtask.worker.tasks import dtask_task

log = logging.getLogger("dtask.worker")


class Resent(Exception):
    """The child went back to the broker in a message of its own."""


class Batch(Received):
    """A ``dtask.children`` message. Its children are claimed ahead in one statement. Each
    one's success is held, and written with the next child's start that writes, the running
    child's first heartbeat, or the message's end, in one statement: a message of short
    children first taken makes four statements, not two per child. A worker killed in between
    runs those children again (each is counted once: the writes are fenced), and spends no
    attempt: one taken for the first time counts its attempt with its success or failure, and
    its next take counts as it starts. A retry is a ``dtask.child`` message of its own (the
    claim taken with the message handed back first, if the child still holds it); its run is
    finalized once, at the message's end. Used by the pool process's thread and its child's
    heartbeat thread."""

    skipped = (Ignore, ChildFailed, Resent)

    def __init__(
        self, task: Task, run_id: int, template: str, group_id: str, queue: str | None,
        items: list[list[Any]],
    ) -> None:  # fmt: skip
        super().__init__([Child(run_id, int(i), template, spec) for i, spec in items])
        self.task, self.run_id, self.group_id, self.queue = task, run_id, group_id, queue
        self.claimed_at = self.renewed_at = time.monotonic()  # renewed: a message claim's lease
        self.held: list[tuple[Child, Finished]] = []
        self._lock = threading.Lock()

    @property
    def retries(self) -> int:  # type: ignore[override]
        return int(self.task.request.retries or 0)

    def elsewhere(self, countdown: float) -> NoReturn:
        raise self.task.retry(countdown=countdown, max_retries=None)

    def receive(self) -> None:
        """The children that can be taken, in one durable commit (none where PostgreSQL
        cannot be reached: each is then claimed, or sent back, on its own)."""
        super().receive()
        self.claimed_at = time.monotonic()
        config = services.current().settings
        indexes = [c.index for c in self.children]
        try:
            ahead = self.store.children.claim_many(
                self.run_id, indexes, owner_name(), config.lease_ttl
            )
        except DatabaseUnavailable as exc:
            log.info("run %s: children not claimed ahead: %s", self.run_id, exc)
            ahead = {}
        for child in self.children:
            child.taken = ahead.get(child.index)
        self.renewed_at = self.claimed_at
        self.began = time.monotonic()

    def start(self, child: Child, claim: Claim, lease_ttl: float) -> Claim | None:
        """Children taken with the message start unwritten while their leases are young: a
        row claim's runs from the message's claim, a message claim's from its last renewal."""
        since = self.claimed_at if claim.message is None else self.renewed_at
        if not claim.counted and time.monotonic() - since < unwritten_for():
            return claim
        with self._lock:
            finished, started = self.store.children.write_batch(self._done(), claim, lease_ttl)
            self._written(finished)
            self.renewed_at = time.monotonic()
        return started

    def renew(self, child: Child, claim: Claim, lease_ttl: float) -> RunState | None:
        """The running child's heartbeat writes the successes held before it first: their
        leases run from the message's claim, and this child may take longer than they do."""
        children = self.store.children
        with self._lock:
            if self.held:
                done = self._done()
                with contextlib.suppress(DatabaseUnavailable):  # the message's end tries again
                    self._written(children.write_batch(done, None, lease_ttl)[0])
        state = children.renew_lease(claim, lease_ttl)
        self.renewed_at = time.monotonic()
        return state

    def finish(self, child: Child, done: Finished) -> None:
        with self._lock:
            self.held.append((child, done))

    def finalize(self, child: Child) -> None:
        """The message asks once, after its last child."""

    def retry(self, child: Child, countdown: float, exc: BaseException | None = None) -> NoReturn:
        if child.taken is not None:
            unclaim(self.store, child.taken)
        publish([self._resent(child)], countdown=countdown)
        raise Resent()

    def close(self) -> None:
        """The held successes written; the message's claim (if it was claimed as one row) let
        go. Children it still covers (their ends not written) are sent again on their own;
        where PostgreSQL cannot be reached, its lease expires and the reaper sends them."""
        self._flush()
        claim = next((c.taken for c in self.children if c.taken and c.taken.message), None)
        if claim is None:
            return
        try:
            left = self.store.children.close(claim)
        except DatabaseUnavailable as exc:
            log.info("run %s: message not let go (its lease will expire): %s", self.run_id, exc)
            return
        if left:
            log.info("run %s: %s children of a message sent again", self.run_id, len(left))
            publish(left)

    def ended_all(self) -> None:
        if self.took:
            # the message's whole time per child ran, its claim and bookkeeping included: by
            # claim-to-finish alone, messages meant to take 50 ms took twice that
            note_time(self.run_id, (time.monotonic() - self.began) / len(self.took))
            finalize_if_last(self.store, self.run_id)

    def _flush(self) -> None:
        """Write the held successes. Never raises: children whose successes cannot be written
        are sent again, as a child whose finish met an unreachable PostgreSQL is."""
        ttl = services.current().settings.lease_ttl
        with self._lock:
            if not self.held:
                return
            done = self._done()
            try:
                finished, _ = patiently(
                    lambda: self.store.children.write_batch(done, None, ttl), ttl
                )
            except DatabaseUnavailable as exc:
                links.cut_off()
                log.warning(
                    "run %s: %s finished children not written: %s; sending them again in %g s",
                    self.run_id, len(done), exc, ttl,
                )  # fmt: skip
                publish([self._resent(c) for c, _ in self.held], countdown=ttl)
                self.held = []
            else:
                self._written(finished)

    def _done(self) -> list[Finished]:
        return [d for _, d in self.held]

    def _written(self, finished: set[int]) -> None:
        for child, done in self.held:
            if done.claim.child_id not in finished:
                log.warning("%s: %s", child, lease_lost(done.claim))
        self.held = []

    def _resent(self, child: Child) -> Redispatch:
        return Redispatch(
            child.run_id, child.index, child.spec, child.template, self.group_id, self.queue
        )


@dtask_task(CHILDREN)
@traces.children
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
        Batch(self, run_id, template, group_id, queue, items).run()
    finally:
        drain.finished()
