"""The monitoring service: a loop in every worker's main process and in `dtask serve` judges
the cluster every few seconds (lost and idle workers, stalled and late runs, misfired
schedules) and keeps the alerts in PostgreSQL in step. One pass at a time cluster-wide, so
each alert is logged once when it opens and once when it closes, and POSTed to
``DTASK_ALERT_WEBHOOK`` (JSON ``{"event": "opened"|"closed", "alert": {...}}``) if set."""

from __future__ import annotations

import json
import logging
import time

from dtask import services
from dtask.db.alerts import OpenAlert
from dtask.domain.alerts import Limits, evaluate
from dtask.worker import outbound
from dtask.worker.loop import Loop

log = logging.getLogger("dtask.alerts")
INTERVAL = 2.0
WEBHOOK_TRIES = 3
WEBHOOK_DEADLINE = outbound.DEADLINE  # seconds for one whole try (connect to answer)


def limits() -> Limits:
    settings = services.current().settings
    return Limits(
        lost_after=settings.worker_seen_within,
        idle_after=settings.idle_alert,
        stalled_after=settings.stall_alert,
        misfire_shown_for=settings.misfire_alert,
        lost_shown_for=settings.lost_messages_alert,
    )


PASS_SLOT = "pass:monitor"


def once() -> int:
    """One pass, if the cluster's next one is this worker's (at most one an interval in the
    whole cluster); how many alerts opened or closed."""
    if not services.store().leases.due(PASS_SLOT, 0.9 * INTERVAL):
        return 1  # another worker's pass is the cluster's: the same pace
    settings = services.current().settings
    bounds = limits()
    changes = services.store().alerts.judge(
        settings.worker_forget, lambda facts: evaluate(facts, bounds), bounds.stalled_after
    )
    if changes is None:  # another monitor is in its pass
        return 1
    for alert in changes.opened:
        log.warning("alert opened: %s", alert.message)
    for alert in changes.closed:
        log.info("alert closed: %s", alert.message)
    webhook = settings.alert_webhook
    if webhook is not None:
        for event, alerts in (("opened", changes.opened), ("closed", changes.closed)):
            for alert in alerts:
                _post(webhook.get_secret_value(), event, alert)
    return 1  # always busy: an alert must show within a few seconds


def _post(url: str, event: str, alert: OpenAlert) -> None:
    """Up to WEBHOOK_TRIES bounded tries (:mod:`dtask.worker.outbound`). The webhook is the
    operator's: it may be a private address (an internal Alertmanager). Its URL may hold a
    secret, so it is never logged; the error names at most its host."""
    body = json.dumps({"event": event, "alert": alert.as_json()}).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "dtask-alerts/1"}
    error: str | None = ""
    for attempt in range(WEBHOOK_TRIES):
        error = outbound.post(url, body, headers, deadline=WEBHOOK_DEADLINE, allow_private=True)
        if error is None:
            return
        if attempt + 1 < WEBHOOK_TRIES:
            time.sleep(0.5 * 2**attempt)
    log.warning("alert %s (%s) not delivered to DTASK_ALERT_WEBHOOK: %s", alert.id, event, error)


def loop() -> Loop:
    return Loop("monitor", INTERVAL, once)
