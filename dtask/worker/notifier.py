"""Completion notifications, delivered by a loop in every `dtask worker` main process: a
finished run's ``notify_url`` gets a POST of the run's JSON, signed with its client's secret
(``X-Dtask-Signature: sha256=<HMAC-SHA256 of the body>``), retried with backoff until it is
answered 2xx or an hour has passed. At least once: a worker that dies mid-try leaves the run
to be taken again when its hold ends.

Each try is one bounded call (:mod:`dtask.worker.outbound`: DEADLINE over the whole call, no
redirects, a bounded answer, no private addresses unless DTASK_NOTIFY_ALLOW_PRIVATE), made in
a thread of its own, SLOTS at a time: a pass takes only as many due runs as there are free
slots and does not wait for their tries, so a receiver that holds its try to the deadline
holds one slot for that long, and the others keep delivering."""

from __future__ import annotations

import json
import logging
import threading

from dtask import services
from dtask.db.notify import Due
from dtask.domain.notify import SIGNATURE_HEADER, backoff, signature
from dtask.worker import outbound
from dtask.worker.loop import Loop

log = logging.getLogger("dtask.worker")
INTERVAL = 0.5
DEADLINE = outbound.DEADLINE  # seconds a receiver has for one whole try (connect to answer)
SLOTS = 8  # tries under way at once in one worker
HOLD_SLACK = 30.0  # a hold lasts a try's deadline and this, for the try's reads and writes


class Notifier:
    """The tries under way in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trying = 0

    def once(self) -> int:
        """One pass: take as many due deliveries as there are free slots and start a try of
        each (their run's JSON and signature made here, in turn); how many tries are under
        way. Only each try's outcome is written from its own thread."""
        with self._lock:
            free = SLOTS - self._trying
        if free <= 0:
            return SLOTS
        deadline = DEADLINE
        allow_private = services.current().settings.notify_allow_private
        store = services.store()
        for item in store.notify.due(free, hold=deadline + HOLD_SLACK):
            body = json.dumps(store.runs.status(item.run_id).as_json()).encode()
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "dtask-notify/1",
                SIGNATURE_HEADER: signature(store.notify.secret(item.client), body),
                "X-Dtask-Run": str(item.run_id),
            }
            with self._lock:
                self._trying += 1
            threading.Thread(
                target=self._try,
                args=(item, body, headers, deadline, allow_private),
                name=f"dtask notify {item.run_id}",
                daemon=True,  # a worker stopping does not wait for a try: its hold ends
            ).start()
        with self._lock:
            return self._trying

    def _try(
        self, item: Due, body: bytes, headers: dict[str, str], deadline: float, allow: bool
    ) -> None:
        try:
            error = outbound.post(item.url, body, headers, deadline=deadline, allow_private=allow)
            _record(item, error)
        except Exception as exc:  # PostgreSQL unreachable: the run is tried when its hold ends
            log.warning("run %s: notification try not recorded: %s", item.run_id, exc)
        finally:
            with self._lock:
                self._trying -= 1


def _record(item: Due, error: str | None) -> None:
    store = services.store()
    if error is None:
        written = store.notify.delivered(item)
    else:
        written = store.notify.failed(item, error, backoff(item.attempts + 1))
        if written and item.give_up:
            log.warning("run %s: notification to %s given up: %s", item.run_id, item.url, error)
    if not written:
        log.info("run %s: a notification try outlived its hold: not recorded", item.run_id)


_notifier = Notifier()


def once() -> int:
    return _notifier.once()


def loop() -> Loop:
    return Loop("notifier", INTERVAL, once)
