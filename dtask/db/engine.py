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
                connect_args={
                    "connect_timeout": 5,
                    # the pid lets operators (and fault tests) map a backend to its process
                    "application_name": f"dtask:{os.getpid()}",
                },
            )
            _engines[key] = engine
        return engine


def _forget_inherited_engines() -> None:
    # A forked child must not close its parent's sockets (that would end the parent's
    # sessions): drop the inherited pools without closing them.
    global _lock
    _lock = threading.Lock()
    for key in [k for k in _engines if k[0] != os.getpid()]:
        _engines.pop(key).dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_engines)


def unreachable(exc: OperationalError, engine: Engine) -> DatabaseUnavailable:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    return DatabaseUnavailable(
        f"cannot reach PostgreSQL at {engine.url.render_as_string(hide_password=True)}:"
        f" {reason} (is it running? set DTASK_DATABASE_URL)"
    )
