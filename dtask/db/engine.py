"""One SQLAlchemy engine per (process, URL): pooled connections must never cross a fork."""

from __future__ import annotations

import os
import threading

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import OperationalError

from dtask.exceptions import DatabaseUnavailable

_engines: dict[tuple[int, str], Engine] = {}
_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    key = (os.getpid(), url)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = create_engine(
                url,
                pool_pre_ping=True,  # survive a PostgreSQL restart without a failed write
                pool_size=4,
                max_overflow=8,
                connect_args={"connect_timeout": 5, "application_name": "dtask"},
            )
            _engines[key] = engine
        return engine


def unreachable(exc: OperationalError, engine: Engine) -> DatabaseUnavailable:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return DatabaseUnavailable(
        f"cannot reach PostgreSQL at {engine.url.render_as_string(hide_password=True)}:"
        f" {reason} (is it running? set DTASK_DATABASE_URL)"
    )
