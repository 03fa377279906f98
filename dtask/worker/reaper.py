"""The reaper: failover detected by dtask, not by the broker.

A thread in every `dtask worker` main process; each pass takes a cluster-wide advisory lock,
so exactly one reaps at a time and any survivor takes over when that worker dies. A pass:

1. finalizes running runs whose children have all finished (their callback never ran);
2. releases children whose lease expired (owner dead or hung) and re-sends them with their
   original task id and chord options, so they resume from their checkpoint elsewhere;
3. splits/dispatches runs stuck in pending/splitting with no master on them;
4. re-sends pending children of stalled runs when their queue is empty (lost messages).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from celery.signals import worker_ready, worker_shutting_down

from dtask import services
from dtask.db import Store
from dtask.domain.runs import RunState
from dtask.exceptions import DtaskError
from dtask.worker.app import app
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.dispatch import publish
from dtask.worker.tasks import TemplateElsewhere, run_master

log = logging.getLogger("dtask.reaper")
CALLBACK_GRACE = 2.0  # seconds the chord callback gets before the reaper finalizes instead
T = TypeVar("T")


@dataclass(frozen=True)
class Pass:
    leader: bool
    finalized: int = 0
    expired: int = 0
    unstuck: int = 0
    resent: int = 0


def queue_size(queue: str) -> int:
    with app.connection_for_write() as conn:
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


def reap_once() -> Pass:
    """One pass, if this worker holds the reaper's turn. Each step, and each run within a step,
    is isolated: one that fails (user code, a held lock, a broken row) is logged and skipped."""
    config = services.current().settings
    store = services.store()
    recovery, guard = store.recovery, failures.guard
    with recovery.turn(hold_for=config.lease_ttl) as leader:
        if not leader:
            return Pass(leader=False)
        finalized = 0
        unfinalized = partial(recovery.unfinalized_runs, settled_for=CALLBACK_GRACE)
        for run_id in guard("finding unfinalized runs", None, unfinalized) or []:
            # never wait on a run's lock: whoever holds it is finalizing or changing the run
            state = guard("finalize", run_id, partial(store.runs.finalize, run_id, wait=False))
            if state is not None and state.finished:
                finalized += 1
                log.warning("reaper: run %s finalized (%s): its callback never ran", run_id, state)
        expired = guard("releasing expired leases", None, partial(_release_expired, store)) or 0
        unstuck = 0
        stuck = partial(recovery.stuck_runs, config.stall_timeout)
        for run_id, state in guard("finding stuck runs", None, stuck) or []:
            after = guard("restart", run_id, partial(_restart, store, run_id, state))
            if after is not None and after is not state:
                unstuck += 1
                log.warning("reaper: run %s was stuck in %s, now %s", run_id, state, after)
        resent = 0
        stalled = partial(recovery.stalled_runs, config.stall_timeout)
        for run_id, queue in guard("finding stalled runs", None, stalled) or []:
            resent += guard("re-send", run_id, partial(_resend, store, run_id, queue)) or 0
        return Pass(True, finalized, expired, unstuck, resent)


def _release_expired(store: Store) -> int:
    expired = store.recovery.release_expired()
    if expired:
        publish(expired)
        for c in expired:
            log.warning("reaper: run %s child %s lease expired, re-sent", c.run_id, c.index)
    return len(expired)


def _restart(store: Store, run_id: int, state: RunState) -> RunState:
    try:
        return run_master(store, run_id, wait=False)
    except TemplateElsewhere:
        return state  # left to a worker that knows the template (the reaper runs everywhere)


def _resend(store: Store, run_id: int, queue: str | None) -> int:
    if queue_size(queue or DEFAULT_QUEUE) != 0:
        return 0
    lost = store.recovery.pending_children(run_id)
    sent = publish(lost)
    log.warning("reaper: run %s stalled, re-sent %d pending children", run_id, sent)
    return sent


class Reaper:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dtask reaper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                reap_once()
            except DtaskError as exc:
                log.warning("reaper: %s", exc)
            except Exception:
                log.exception("reaper pass failed")


_reaper: Reaper | None = None


def install() -> None:
    """Run a reaper in this worker's main process once it is ready (called by `dtask worker`)."""
    worker_ready.connect(_start, weak=False)
    worker_shutting_down.connect(_stop, weak=False)


def _start(**_: Any) -> None:
    global _reaper
    if _reaper is None:
        _reaper = Reaper(services.current().settings.reaper_interval)
        _reaper.start()


def _stop(**_: Any) -> None:
    if _reaper is not None:
        _reaper.stop()
