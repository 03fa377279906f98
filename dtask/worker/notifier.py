"""Completion notifications, delivered by a loop in every `dtask worker` main process: a
finished run's ``notify_url`` gets a POST of the run's JSON, signed with its client's secret
(``X-Dtask-Signature: sha256=<HMAC-SHA256 of the body>``), retried with backoff until it is
answered 2xx or an hour has passed. At least once: a worker that dies mid-try leaves the run
to be taken again when its hold ends."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

from dtask import services
from dtask.db.notify import Due
from dtask.domain.notify import SIGNATURE_HEADER, backoff, signature
from dtask.worker.loop import in_worker

log = logging.getLogger("dtask.worker")
INTERVAL = 0.5
TIMEOUT = 10.0  # seconds a receiver has to answer one try
BATCH = 20


def once() -> int:
    """One pass: try every due delivery; how many there were."""
    store = services.store()
    due = store.notify.due(BATCH, hold=TIMEOUT * BATCH + 30)
    for item in due:
        error = _post(item, store.runs.status(item.run_id).as_json())
        if error is None:
            store.notify.delivered(item.run_id)
            continue
        retry_in = backoff(item.attempts + 1)
        store.notify.failed(item, error, retry_in)
        if item.give_up:
            log.warning("run %s: notification to %s given up: %s", item.run_id, item.url, error)
    return len(due)


def _post(item: Due, run: dict[str, Any]) -> str | None:
    """None when the receiver took it (2xx), else what went wrong."""
    body = json.dumps(run).encode()
    request = urllib.request.Request(item.url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("User-Agent", "dtask-notify/1")
    request.add_header(
        SIGNATURE_HEADER, signature(services.store().notify.secret(item.client), body)
    )
    request.add_header("X-Dtask-Run", str(item.run_id))
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return None if 200 <= response.status < 300 else f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        exc.close()
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


def install() -> None:
    in_worker("notifier", INTERVAL, once)
