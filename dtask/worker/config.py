"""Celery settings for dtask (the top-level ``celeryconfig.py`` exposes the same)."""

from __future__ import annotations

import math
import socket
from typing import Any

from dtask.domain.tiers import DEFAULT_QUEUE as DEFAULT_QUEUE  # re-exported
from dtask.services import broker_urls
from dtask.settings import Settings, is_redis, is_sentinel

# Redis redelivers an unacked message only after this; dtask's own leases handle failover,
# so it only has to exceed the longest child run (a redelivered duplicate is harmless anyway).
VISIBILITY_TIMEOUT = 12 * 3600
# kombu's and Celery's Sentinel clients, remembering which sentinel answered (a frozen one)
SENTINEL_TRANSPORT = "dtask.worker.sentinels:Transport"
SENTINEL_BACKEND = "dtask.worker.sentinels:Backend"


def _keepalive_options(timeout: float) -> dict[int, int]:
    """TCP options of a Redis connection: probe an idle peer, drop it after ``timeout``."""
    options = {
        socket.TCP_KEEPIDLE: max(1, int(timeout / 2)),
        socket.TCP_KEEPINTVL: max(1, int(timeout / 4)),
        socket.TCP_KEEPCNT: 3,
    }
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux: unacknowledged data also times out
        options[socket.TCP_USER_TIMEOUT] = int(timeout * 1000)
    return options


def _sentinel(timeout: float) -> dict[str, Any]:
    """The sentinels' own connections: one that does not answer is passed over after one
    ``timeout`` (redis-py's default retries made a frozen sentinel cost 13 timeouts)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }


def link_settings(config: Settings, broker: str, backend: str) -> dict[str, Any]:
    """Bounded waits on the broker and result backend, so a link that silently drops packets
    fails a call (which Celery retries on a new connection) instead of hanging it. A blocking
    Redis call gives up after ``network_timeout``; the worker's BRPOP, which no socket timeout
    covers, is dropped when its reply is ``health_check_interval`` overdue (kombu 5.7); AMQP
    connections exchange heartbeats, so both ends notice a dead peer within about two."""
    timeout = config.network_timeout
    redis_tcp = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
        "socket_keepalive_options": _keepalive_options(timeout),
        "health_check_interval": max(1, math.ceil(timeout)),
    }
    broker_options = redis_tcp if is_redis(broker) else {}
    sentinel = {"master_name": config.sentinel_master, "sentinel_kwargs": _sentinel(timeout)}
    return {
        **({"broker_transport": SENTINEL_TRANSPORT} if is_sentinel(broker) else {}),
        "broker_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT,
            **broker_options,
            **(sentinel if is_sentinel(broker) else {}),
        },
        "result_backend_transport_options": {
            "visibility_timeout": VISIBILITY_TIMEOUT,
            **(sentinel if is_sentinel(backend) else {}),
        },
        "broker_heartbeat": max(2, math.ceil(timeout / 2)),
        "redis_socket_timeout": timeout,
        "redis_socket_connect_timeout": timeout,
        # redis-py's Unix socket connections take no keepalive (the embedded Redis's)
        "redis_socket_keepalive": backend.startswith(("redis://", "rediss://", "sentinel://")),
        "redis_backend_health_check_interval": max(1, math.ceil(timeout)),
    }


def celery_settings(config: Settings) -> dict[str, Any]:
    broker, backend = broker_urls(config)
    queue_type = config.rabbitmq_queue_type if broker.startswith("amqp") else "classic"
    return {
        "task_default_queue_type": queue_type,
        "task_create_missing_queue_type": queue_type,
        "broker_url": broker,
        "result_backend": f"{SENTINEL_BACKEND}+{backend}" if is_sentinel(backend) else backend,
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
        "result_expires": 7 * 24 * 3600,
        "task_publish_retry_policy": {
            "max_retries": 3,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        "worker_hijack_root_logger": True,
        "worker_redirect_stdouts": True,
        "worker_redirect_stdouts_level": "INFO",  # a child's print is output, not a warning
        **link_settings(config, broker, backend),
    }
