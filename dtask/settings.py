"""DTASK_* environment -> frozen settings. The one place that reads dtask's environment."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from dtask.exceptions import ConfigurationError

T = TypeVar("T", int, float)


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str | None
    broker_url: str | None
    result_backend: str | None
    templates: tuple[str, ...]
    max_children: int
    lease_ttl: float
    heartbeat_interval: float
    reaper_interval: float
    stall_timeout: float
    drain_grace: float
    checkpoint_interval: float
    checkpoint_every: int
    retry_delay: float

    @property
    def embedded_database(self) -> bool:
        return self.database_url is None

    @property
    def embedded_broker(self) -> bool:
        return self.broker_url is None

    @property
    def embedded_result_backend(self) -> bool:
        return self.result_backend is None


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://", "redis+socket://"))


# name -> (default, meaning). The README's configuration table is checked against this.
DOCUMENTED: dict[str, tuple[str, str]] = {
    "DTASK_HOME": ("./.dtask", "where the embedded PostgreSQL and Redis keep their data"),
    "DTASK_DATABASE_URL": ("embedded", "PostgreSQL URL; unset = embedded PostgreSQL"),
    "DTASK_BROKER_URL": ("embedded", "Celery broker URL; unset = embedded Redis"),
    "DTASK_RESULT_BACKEND": ("broker or embedded", "Celery result backend (must be Redis)"),
    "DTASK_TEMPLATES": ("", "comma-separated modules that register templates"),
    "DTASK_MAX_CHILDREN": ("100000", "largest split a run may have"),
    "DTASK_LEASE_TTL": ("8", "seconds a child's lease lasts without a heartbeat"),
    "DTASK_HEARTBEAT_INTERVAL": ("lease TTL / 4", "seconds between a running child's heartbeats"),
    "DTASK_REAPER_INTERVAL": ("1", "seconds between reaper passes (one reaper cluster-wide)"),
    "DTASK_STALL_TIMEOUT": ("15", "seconds without progress before lost messages are re-sent"),
    "DTASK_DRAIN_GRACE": ("5", "seconds a stopping worker's child gets to reach a checkpoint"),
    "DTASK_CHECKPOINT_INTERVAL": ("1.0", "ctx.resume writes a checkpoint after this many seconds"),
    "DTASK_CHECKPOINT_EVERY": ("10000", "...or after this many items, whichever comes first"),
    "DTASK_RETRY_DELAY": ("1.0", "seconds before a failed child's next attempt"),
}


def _number(env: Mapping[str, str], name: str, default: T, cast: Callable[[str], T], low: T) -> T:
    text = env.get(name)
    if text is None or text == "":
        return default
    try:
        value = cast(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} is not a number") from None
    if value < low:
        raise ConfigurationError(f"{name}={text!r} must be >= {low}")
    return value


def load(env: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    home = Path(env.get("DTASK_HOME") or ".dtask").expanduser().absolute()
    broker = env.get("DTASK_BROKER_URL") or None
    backend = env.get("DTASK_RESULT_BACKEND") or None
    if backend is None and broker is not None and is_redis(broker):
        backend = broker
    if backend is not None and not is_redis(backend):
        raise ConfigurationError(
            f"DTASK_RESULT_BACKEND must be a redis:// URL (chords need it), got {mask(backend)}"
        )
    lease_ttl = _number(env, "DTASK_LEASE_TTL", 8.0, float, 1.0)
    heartbeat = _number(env, "DTASK_HEARTBEAT_INTERVAL", lease_ttl / 4, float, 0.1)
    if heartbeat >= lease_ttl / 2:
        raise ConfigurationError(
            f"DTASK_HEARTBEAT_INTERVAL ({heartbeat:g}) must be under half of DTASK_LEASE_TTL"
            f" ({lease_ttl:g}), or leases expire between heartbeats"
        )
    return Settings(
        home=home,
        database_url=env.get("DTASK_DATABASE_URL") or None,
        broker_url=broker,
        result_backend=backend,
        templates=tuple(m.strip() for m in env.get("DTASK_TEMPLATES", "").split(",") if m.strip()),
        max_children=_number(env, "DTASK_MAX_CHILDREN", 100_000, int, 1),
        lease_ttl=lease_ttl,
        heartbeat_interval=heartbeat,
        reaper_interval=_number(env, "DTASK_REAPER_INTERVAL", 1.0, float, 0.1),
        stall_timeout=_number(env, "DTASK_STALL_TIMEOUT", 15.0, float, 1.0),
        drain_grace=_number(env, "DTASK_DRAIN_GRACE", 5.0, float, 0.0),
        checkpoint_interval=_number(env, "DTASK_CHECKPOINT_INTERVAL", 1.0, float, 0.0),
        checkpoint_every=_number(env, "DTASK_CHECKPOINT_EVERY", 10_000, int, 1),
        retry_delay=_number(env, "DTASK_RETRY_DELAY", 1.0, float, 0.0),
    )


_PASSWORD = re.compile(r"(?P<head>[a-z+]+://[^:/@]*:)(?P<secret>[^@]*)@")


def mask(url: str) -> str:
    """A URL fit for logs and terminals: the password replaced by ***."""
    return _PASSWORD.sub(lambda m: f"{m.group('head')}***@" if m.group("secret") else m[0], url)
