"""One SQLAlchemy engine per (process, URL): pooled connections must never cross a fork."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from dtask.exceptions import DatabaseUnavailable

_engines: dict[tuple[int, str, bool, bool], Engine] = {}
_lock = threading.Lock()


def engine_for(url: str, durable: bool = True, owner: bool = False) -> Engine:
    """The process's engine for ``url``.

    ``owner=True`` is for a child owner's own single-statement writes, the statements every
    child runs: autocommit, and connections pinged only after sitting idle (the callers retry a
    write that still finds its connection dead). With ``durable=False`` as well, its sessions
    commit without waiting for the WAL flush (heartbeats, finish, release: losing one in a
    crash is safe, the fence and the lease see to it). Everything else pings on every checkout
    (pool_pre_ping), so a PostgreSQL restart never fails a client's read or a run transition."""
    key = (os.getpid(), url, durable, owner)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            connect_args: dict[str, Any] = {
                "connect_timeout": 5,
                # the pid lets operators (and fault tests) map a backend to its process
                "application_name": f"dtask:{os.getpid()}",
            }
            options: dict[str, Any] = {}
            if owner:
                options["isolation_level"] = "AUTOCOMMIT"  # single-statement writes only
                if not durable:
                    connect_args["options"] = "-c synchronous_commit=off"
            engine = create_engine(
                url,
                pool_pre_ping=not owner,
                pool_use_lifo=True,  # the hot connection is reused, the spare ones go idle
                pool_size=4,
                max_overflow=8,
                connect_args=connect_args,
                **options,
            )
            if owner:
                _ping_idle_connections(engine)
            _engines[key] = engine
        return engine


# A lease connection that sat in the pool longer than this is pinged before use; a busy one
# is not. A connection that was alive before a PostgreSQL restart has been idle for at least
# the restart, so usually it gets pinged; when the restart was quicker, the write fails with
# DatabaseUnavailable and is retried on a fresh connection.
PING_AFTER_IDLE = 0.5


def _ping_idle_connections(engine: Engine) -> None:
    """pool_pre_ping, minus the round trip per checkout (two per short child)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"connection lost while idle: {exc}") from exc


def _forget_inherited_engines() -> None:
    # A forked child must not close its parent's sockets (that would end the parent's
    # sessions): drop the inherited pools without closing them.
    global _lock
    _lock = threading.Lock()
    for key in [k for k in _engines if k[0] != os.getpid()]:
        _engines.pop(key).dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_engines)


# SQLSTATEs of a lost or refused connection; any other state is the server's answer.
_CONNECTION_STATES = ("08", "57P01", "57P02", "57P03")


def unreachable(exc: OperationalError, engine: Engine) -> DatabaseUnavailable:
    """The one-line error for an OperationalError: the connection, or the server's real cause
    (a deadlock, a full disk, a cancelled statement), named as such."""
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    where = engine.url.render_as_string(hide_password=True)
    state = getattr(exc.orig, "sqlstate", None)
    if state is None or state.startswith(_CONNECTION_STATES):
        return DatabaseUnavailable(
            f"cannot reach PostgreSQL at {where}: {reason} (is it running? set DTASK_DATABASE_URL)"
        )
    return DatabaseUnavailable(f"PostgreSQL at {where} refused: {reason} (SQLSTATE {state})")
