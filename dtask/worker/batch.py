"""``dtask.children``: several short children of one run in one message (the dispatcher packs
them when the run's children take less than ``BATCH_SECONDS`` each, docs/benchmarks.md).

One pool process runs them one after the other, each exactly as ``dtask.child`` runs one:
checkpointed, finished, counted. A message the dispatcher sent is claimed as one row (one
lease and fence for its children, ``db/message_claims.py``), any other child by its own row.
Only the message is shared: a child whose attempt fails, or that meets an unreachable
PostgreSQL, is sent again in a message of its own; one that is refused (finished, running
elsewhere, its run cancelled) is skipped; on a drain the children not started yet are handed
over. Their successes are written together (``Held``). A worker killed mid-message has the
children it had not written sent again: the message redelivered finds its claim taken (busy),
the reaper re-sends them once its lease expires.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Finished, Redispatch
from dtask.db.children import lease_lost
from dtask.domain.runs import RunState
from dtask.domain.templates import registry
from dtask.exceptions import ChildFailed, DatabaseUnavailable, LeaseLost
from dtask.worker import drain, links, traces
from dtask.worker.child_store import LifecycleStore, hand_over, owner_name, patiently
from dtask.worker.delivery import Delivery
from dtask.worker.finalize import finalize_if_last
from dtask.worker.lifecycle import note_time, run_child, template_backoff, unwritten_for
from dtask.worker.messages import publish
from dtask.worker.task_table import CHILDREN
from dtask.worker.tasks import dtask_task

log = logging.getLogger("dtask.worker")


class Resent(Exception):
    """The child went back to the broker in a message of its own."""


class InBatch(Delivery):
    """A child of a ``dtask.children`` message: its start, heartbeat and success go through
    the message's ``Held`` (successes written together); a retry is a ``dtask.child``
    message of its own (the claim taken with the message handed back first, if the child
    still holds it); its run is finalized once, at the message's end."""

    def __init__(self, child: Redispatch, taken: Claim | None, held: Held) -> None:
        super().__init__(child.run_id, child.index, child.template, child.spec, taken)
        self.child, self.held = child, held

    def start(self, store: LifecycleStore, claim: Claim, lease_ttl: float) -> Claim | None:
        return self.held.start(claim, lease_ttl)

    def renew(self, store: LifecycleStore, claim: Claim, lease_ttl: float) -> RunState | None:
        return self.held.renew(claim, lease_ttl)

    def finish(self, store: LifecycleStore, done: Finished) -> None:
        self.held.hold(self.child, done)

    def finalize(self, store: LifecycleStore) -> None:
        """The message asks once, after its last child."""

    def retry(self, countdown: float, exc: BaseException | None = None) -> NoReturn:
        if self.taken is not None:
            _unclaim(self.taken)
        publish([self.child], countdown=countdown)
        raise Resent()

    def ended(self) -> None:
        """The batch's message gets its own final event."""


class Held:
    """The successes of a message's children not written yet. Each is written with the next
    child's start that writes, the running child's first heartbeat, or the message's end
    (``flush``), in one statement: a message of short children first taken makes four
    statements, not two per child. A worker killed in between runs those children again
    (each is counted once: the writes are fenced), and spends no attempt: one taken for the
    first time counts its attempt with its success or failure, and its next take counts as
    it starts. Used by the pool process's thread and its child's heartbeat thread."""

    def __init__(self, claimed_at: float) -> None:
        self.claimed_at = claimed_at
        self.renewed_at = claimed_at  # a message's claim: its lease's last renewal
        self.children: list[Redispatch] = []
        self.done: list[Finished] = []
        self._lock = threading.Lock()

    def hold(self, child: Redispatch, done: Finished) -> None:
        with self._lock:
            self.children.append(child)
            self.done.append(done)

    def start(self, claim: Claim, lease_ttl: float) -> Claim | None:
        """Children taken with the message start unwritten while their leases are young: a
        row claim's runs from the message's claim, a message claim's from its last renewal."""
        since = self.claimed_at if claim.message is None else self.renewed_at
        if not claim.counted and time.monotonic() - since < unwritten_for():
            return claim
        with self._lock:
            finished, started = services.store().children.write_batch(self.done, claim, lease_ttl)
            self._written(finished)
            self.renewed_at = time.monotonic()
        return started

    def renew(self, claim: Claim, lease_ttl: float) -> RunState | None:
        """The running child's heartbeat writes the successes held before it first: their
        leases run from the message's claim, and this child may take longer than they do."""
        children = services.store().children
        with self._lock:
            if self.done:
                with contextlib.suppress(DatabaseUnavailable):  # the message's end tries again
                    self._written(children.write_batch(self.done, None, lease_ttl)[0])
        state = children.renew_lease(claim, lease_ttl)
        self.renewed_at = time.monotonic()
        return state

    def close(self, run_id: int, claims: Iterable[Claim]) -> None:
        """The message's end: let go of its claim (if it was claimed as one row). Children it
        still covers (their ends not written) are sent again on their own; where PostgreSQL
        cannot be reached, its lease expires and the reaper sends them."""
        claim = next((c for c in claims if c.message is not None), None)
        if claim is None:
            return
        try:
            left = services.store().children.close(claim)
        except DatabaseUnavailable as exc:
            log.info("run %s: message not let go (its lease will expire): %s", run_id, exc)
            return
        if left:
            log.info("run %s: %s children of a message sent again", run_id, len(left))
            publish(left)

    def flush(self) -> None:
        """Write the held successes. Never raises: children whose successes cannot be written
        are sent again, as ``run_child`` sends one whose finish met an unreachable
        PostgreSQL."""
        ttl = services.current().settings.lease_ttl
        with self._lock:
            if not self.done:
                return
            try:
                finished, _ = patiently(
                    lambda: services.store().children.write_batch(self.done, None, ttl), ttl
                )
            except DatabaseUnavailable as exc:
                links.cut_off()
                log.warning(
                    "run %s: %s finished children not written: %s; sending them again in %g s",
                    self.children[0].run_id, len(self.children), exc, ttl,
                )  # fmt: skip
                publish(self.children, countdown=ttl)
                self.children, self.done = [], []
            else:
                self._written(finished)

    def _written(self, finished: set[int]) -> None:
        for child, done in zip(self.children, self.done, strict=True):
            if done.claim.child_id not in finished:
                lost = lease_lost(done.claim)
                log.warning("run %s child %s: %s", child.run_id, child.index, lost)
        self.children, self.done = [], []


def _claim_ahead(run_id: int, indexes: list[int]) -> dict[int, Claim]:
    """The message's children that can be taken, in one durable commit (none where PostgreSQL
    cannot be reached: each is then claimed, or sent back, on its own)."""
    config = services.current().settings
    try:
        return services.store().children.claim_many(run_id, indexes, owner_name(), config.lease_ttl)
    except DatabaseUnavailable as exc:
        log.info("run %s: children not claimed ahead: %s", run_id, exc)
        return {}


def _unclaim(claim: Claim) -> None:
    with contextlib.suppress(LeaseLost, DatabaseUnavailable):  # started, or not ours: as is
        services.store().children.unclaim(claim)


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
        if template not in registry:  # a rolling deploy: the whole message waits elsewhere
            raise self.retry(countdown=template_backoff(self.request.retries), max_retries=None)
        claimed_at = time.monotonic()
        ahead = _claim_ahead(run_id, [int(i) for i, _ in items])
        took: list[float] = []
        began = time.monotonic()
        held = Held(claimed_at)
        try:
            for position, (index, spec) in enumerate(items):
                if drain.draining():
                    rest = [(int(i), s) for i, s in items[position:]]
                    for i, _ in rest:
                        if i in ahead:
                            _unclaim(ahead[i])
                    if hand_over(services.store(), run_id, template, rest):
                        log.info("run %s: %s children handed over unstarted", run_id, len(rest))
                    break
                child = Redispatch(run_id, int(index), spec, template, group_id, queue)
                try:
                    seconds = run_child(InBatch(child, ahead.get(child.index), held))
                except (Ignore, ChildFailed, Resent):
                    continue
                if seconds is not None:
                    took.append(seconds)
        finally:
            held.flush()
            held.close(run_id, ahead.values())
        if took:
            # the message's whole time per child ran, its claim and bookkeeping included: by
            # claim-to-finish alone, messages meant to take 50 ms took twice that
            note_time(run_id, (time.monotonic() - began) / len(took))
            finalize_if_last(services.store(), run_id)
    finally:
        drain.finished()
