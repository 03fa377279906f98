"""Celery settings for dtask (the top-level ``celeryconfig.py`` exposes the same)."""

from __future__ import annotations

from typing import Any

from dtask.services import broker_urls
from dtask.settings import Settings

DEFAULT_QUEUE = "dtask"
# Redis redelivers an unacked message only after this; dtask's own leases handle failover,
# so it only has to exceed the longest child run (a redelivered duplicate is harmless anyway).
VISIBILITY_TIMEOUT = 12 * 3600


def celery_settings(config: Settings) -> dict[str, Any]:
    broker, backend = broker_urls(config)
    return {
        "broker_url": broker,
        "result_backend": backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": DEFAULT_QUEUE,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 4,
        "broker_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT},
        "result_backend_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT},
        "result_expires": 7 * 24 * 3600,
        "task_publish_retry_policy": {
            "max_retries": 3,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        "worker_hijack_root_logger": True,
        "worker_redirect_stdouts": True,
    }
