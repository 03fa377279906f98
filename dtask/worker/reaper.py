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
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_ready, worker_shutting_down

from dtask import services
from dtask.exceptions import DtaskError
from dtask.worker.app import app
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.dispatch import publish
from dtask.worker.tasks import run_master

log = logging.getLogger("dtask.reaper")
CALLBACK_GRACE = 2.0  # seconds the chord callback gets before the reaper finalizes instead


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


def reap_once() -> Pass:
    config = services.current().settings
    store = services.store()
    with store.recovery.turn(hold_for=config.lease_ttl) as leader:
        if not leader:
            return Pass(leader=False)
        finalized = 0
        for run_id in store.recovery.unfinalized_runs(settled_for=CALLBACK_GRACE):
            state = store.runs.finalize(run_id)
            finalized += 1
            log.warning("reaper: run %s finalized (%s): its callback never ran", run_id, state)
        expired = store.recovery.release_expired()
        if expired:
            publish(expired)
            for c in expired:
                log.warning("reaper: run %s child %s lease expired, re-sent", c.run_id, c.index)
        unstuck = 0
        for run_id, state in store.recovery.stuck_runs(config.stall_timeout):
            after = run_master(store, run_id, wait=False)
            if after is not state:
                unstuck += 1
                log.warning("reaper: run %s was stuck in %s, now %s", run_id, state, after)
        resent = 0
        for run_id, queue in store.recovery.stalled_runs(config.stall_timeout):
            if queue_size(queue or DEFAULT_QUEUE) == 0:
                lost = store.recovery.pending_children(run_id)
                resent += publish(lost)
                log.warning(
                    "reaper: run %s stalled, re-sent %d pending children", run_id, len(lost)
                )
        return Pass(True, finalized, len(expired), unstuck, resent)


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
