"""The reaper: failover detected by dtask, not by the broker.

A thread in every `dtask worker` main process; each pass takes a cluster-wide advisory lock,
so exactly one reaps at a time and any survivor takes over when that worker dies. A pass only
decides and sends: it runs no user code, and each step is bounded in rows and in time, so a
pass ends well within the turn's limit (one lease TTL). It:

1. finalizes running runs whose children have all finished (their callback never ran);
2. releases children whose lease expired (owner dead or hung) and re-sends them with their
   original task id and chord options, so they resume from their checkpoint elsewhere;
3. re-sends the master message of runs stuck in pending/splitting: a worker that knows the
   template splits and dispatches them (the split is user code and may take long); while
   masters move, only those the queue's front passed, a few a pass (the rest are queued);
4. re-sends pending children whose message was sent a stall timeout ago and not claimed
   (lost messages), oldest first and a bounded number per queue, whatever the queue holds.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from dtask import services
from dtask.db import Store, Waiting
from dtask.domain.dispatch import batch_size
from dtask.domain.runs import RunState
from dtask.exceptions import DtaskError
from dtask.settings import Settings
from dtask.worker import chains, presence
from dtask.worker.app import current
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.finalize import finalize_run, runs_user_code, start_released
from dtask.worker.loop import Loop
from dtask.worker.messages import PUBLISH_BATCH, Sender, publish, send_finalize, send_master

log = logging.getLogger("dtask.reaper")
CALLBACK_GRACE = 2.0  # seconds the chord callback gets before the reaper finalizes instead
MOST_RESENT = 10_000  # children re-sent per queue and pass when the broker lost many at once
T = TypeVar("T")


@dataclass(frozen=True)
class Pass:
    leader: bool
    finalized: int = 0
    expired: int = 0
    unstuck: int = 0
    resent: int = 0


def queue_size(queue: str) -> int:
    with current().connection_for_write() as conn:
        try:
            declared = conn.default_channel.queue_declare(queue=queue, passive=True)
        except conn.channel_errors:
            return 0  # no such queue (Redis drops an empty list's key): nothing is waiting
        return int(declared.message_count)


class Failures:
    """A failing step or run is logged once, and again only when its error changes; the pass
    goes on with the others."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, int | None], str] = {}

    def guard(self, step: str, run_id: int | None, action: Callable[[], T]) -> T | None:
        key = (step, run_id)
        try:
            result = action()
        except Exception as exc:
            error = str(exc) if isinstance(exc, DtaskError) else f"{type(exc).__name__}: {exc}"
            if self._last.get(key) != error:
                if len(self._last) > 10_000:
                    self._last.clear()
                self._last[key] = error
                where = "" if run_id is None else f" of run {run_id}"
                log.error(
                    "reaper: %s%s failed: %s", step, where, error,
                    exc_info=not isinstance(exc, DtaskError),
                )  # fmt: skip
            return None
        self._last.pop(key, None)
        return result


failures = Failures()


class Budget:
    """A pass's time: it must end well within its turn's limit (one lease TTL idle)."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.deadline


class LostMessages:
    """When the lost-message step last ran in this process: at most once per half stall
    timeout, so a long healthy backlog gets a bounded number of duplicates."""

    last = float("-inf")

    @classmethod
    def due(cls, stall: float) -> bool:
        now = time.monotonic()
        if now - cls.last < stall / 2:
            return False
        cls.last = now
        return True


def reap_once() -> Pass:
    """One pass, if this worker holds the reaper's turn. Each step, and each run within a step,
    is isolated: one that fails (a held lock, a broken row, the broker) is logged and skipped;
    a step that runs out of the pass's time leaves the rest to the next pass."""
    config = services.current().settings
    store = services.store()
    recovery, guard = store.recovery, failures.guard
    with recovery.turn(hold_for=config.lease_ttl) as leader, closing(Sender()) as sender:
        if not leader:
            return Pass(leader=False)
        budget = Budget(config.lease_ttl / 2)
        finalized = 0
        unfinalized = partial(recovery.unfinalized_runs, settled_for=CALLBACK_GRACE)
        for run_id in guard("finding unfinalized runs", None, unfinalized) or []:
            if not budget.left():
                break
            finalize = partial(_finalize, store, run_id, sender, config.stall_timeout)
            state = guard("finalize", run_id, finalize)
            if state is not None and state.finished:
                finalized += 1
                log.warning("reaper: run %s finalized (%s): its callback never ran", run_id, state)
        expired = 0
        if budget.left():
            expired = (
                guard("releasing expired leases", None, partial(_release_expired, store, sender))
                or 0
            )
        unstuck = 0
        if budget.left():
            stuck = partial(recovery.take_stuck, config.stall_timeout)
            for run_id, state in guard("finding stuck runs", None, stuck) or []:
                if guard("re-sending the master", run_id, partial(_send_master, run_id, sender)):
                    unstuck += 1
                    log.warning("reaper: run %s stuck in %s, its master re-sent", run_id, state)
        if budget.left():
            released = guard("settling waiting runs", None, recovery.settle_waiting) or []
            for run_id in released:
                log.warning("reaper: run %s released: its upstreams succeeded unsettled", run_id)
            if released:
                start = partial(start_released, None, released, lambda: sender.producer)
                guard("starting released runs", None, start)
        if budget.left():
            for late in guard("deciding runs past their deadline", None, recovery.take_late) or []:
                log.warning(
                    "reaper: run %s is late: none of its children started by its deadline %s"
                    " (delay tolerance %g s)%s",
                    late.run_id, late.deadline.isoformat(timespec="seconds"), late.tolerance,
                    "; failed instead of running late (on_late=fail)" if late.failed else "",
                )  # fmt: skip
        if budget.left():  # chains of runs ended where no finalizer sent them (a cancel)
            hand = partial(
                chains.reap, store, config.stall_timeout, CALLBACK_GRACE, lambda: sender.producer
            )
            guard("handing over the chains of ended runs", None, hand)
        resent = 0
        if budget.left() and LostMessages.due(config.stall_timeout):
            lost = partial(_resend, store, config, budget, sender)
            resent = guard("re-sending lost messages", None, lost) or 0
        if budget.left() and config.retention and Pruning.due():
            guard("pruning old runs", None, partial(_prune, store, config.retention, budget))
        return Pass(True, finalized, expired, unstuck, resent)


class Pruning:
    """When this process's reaper next looks for runs past DTASK_RETENTION: soon again while
    it finds some (a pass prunes only what its time left allows), else in ten minutes."""

    next_at = float("-inf")

    @classmethod
    def due(cls) -> bool:
        return time.monotonic() >= cls.next_at


def _prune(store: Store, retention_days: float, budget: Budget) -> None:
    pruned = store.retention.prune(retention_days * 86400, keep_going=budget.left)
    Pruning.next_at = time.monotonic() + (1 if pruned.runs or pruned.children else 600)
    if pruned.runs or pruned.children:
        log.info(
            "reaper: pruned %s run(s) and %s child(ren) finished over %g day(s) ago"
            " (DTASK_RETENTION)", pruned.runs, pruned.children, retention_days,
        )  # fmt: skip


_handed: dict[int, float] = {}  # run -> when its finalize was last handed to a pool


def _finalize(store: Store, run_id: int, sender: Sender, stall: float) -> RunState | None:
    """A run whose callback never ran: finalized here, never waiting on its lock (whoever holds
    it is finalizing or changing the run), or, when that would run user code (its template's
    reduce), handed to a worker's pool: the reaper's pass runs no user code."""
    if not runs_user_code(store.runs.get(run_id).template):
        return finalize_run(store, run_id, wait=False, producer=lambda: sender.producer)
    now = time.monotonic()
    if now - _handed.get(run_id, -math.inf) < stall:
        return None
    for old in [r for r, at in _handed.items() if now - at > 10 * stall]:
        del _handed[old]
    _handed[run_id] = now
    send_finalize(run_id, through=sender.producer)
    log.warning("reaper: run %s: its callback never ran; a worker finalizes it (reduce)", run_id)
    return None


def _release_expired(store: Store, sender: Sender) -> int:
    expired = store.recovery.release_expired(lease_ttl=services.current().settings.lease_ttl)
    if expired:
        publish(expired, through=sender.producer)
        for c in expired:
            log.warning("reaper: run %s child %s lease expired, re-sent", c.run_id, c.index)
    return len(expired)


def _send_master(run_id: int, sender: Sender) -> bool:
    send_master(run_id, through=sender.producer)
    return True


def _resend(store: Store, config: Settings, budget: Budget, sender: Sender) -> int:
    """Re-send children not claimed a stall timeout after their message was sent, each queue
    on its own (a queue whose broker fails is logged and skipped)."""
    resent = 0
    can = presence.can_run(store.workers.live(config.worker_seen_within))
    for waiting in store.recovery.waiting(config.stall_timeout, can):
        if waiting.overdue and budget.left():
            name = waiting.queue or DEFAULT_QUEUE
            step = partial(_resend_queue, store, config, budget, sender, waiting)
            resent += failures.guard(f"re-sending lost messages of queue {name!r}", None, step) or 0
    return resent


def _resend_queue(
    store: Store, config: Settings, budget: Budget, sender: Sender, waiting: Waiting
) -> int:
    """What the broker holds cannot say which messages are missing, only how many at least
    (pending in PostgreSQL minus what the queue's messages may hold, each up to its runs'
    largest batch): that many of the oldest are re-sent.
    A queue that moves (children started within the stall timeout) may still hide a lost
    message behind a healthy backlog: there at least ``resend_batch`` are. A queue nobody
    consumes gets no blind copies: they would only pile up. A copy of a child that runs or
    ran is refused by its claim."""
    name = waiting.queue or DEFAULT_QUEUE
    missing = waiting.pending - queue_size(name) * batch_size(waiting.fastest)
    blind = config.resend_batch if waiting.started else 0
    todo = min(waiting.overdue, max(blind, missing), MOST_RESENT)
    resent = 0
    while todo > 0 and budget.left():
        lost = store.recovery.take_overdue(
            waiting.queue, waiting.templates, config.stall_timeout, min(todo, PUBLISH_BATCH)
        )
        if not lost:
            break
        resent += publish(lost, through=sender.producer)
        todo -= len(lost)
    if resent and missing > 0:
        store.recovery.note_lost(name, missing, resent)
    if resent:
        log.warning(
            "reaper: queue %r: re-sent %d children not claimed within %g s (%d pending, %d"
            " overdue, about %d missing from the broker)",
            name, resent, config.stall_timeout, waiting.pending, waiting.overdue, max(missing, 0),
        )  # fmt: skip
    return resent


PASS_SLOT = "pass:reaper"


def once() -> int:
    """This worker's report, then a pass if the cluster's next one is due and this worker gets
    it (at most one a reaper interval in the whole cluster, whatever the number of workers;
    the pass itself still takes the reaper's turn). The loop's pace is the same either way."""
    failures.guard("reporting this worker", None, presence.report)
    # a little under the interval: the worker that took the last slot finds the next one free
    interval = services.current().settings.reaper_interval
    due = partial(services.store().leases.due, PASS_SLOT, 0.9 * interval)
    if failures.guard("taking the reaper's slot", None, due):
        reap_once()
    return 1


def loop(settings: Settings) -> Loop:
    return Loop("reaper", settings.reaper_interval, once, slow=settings.reaper_interval)
