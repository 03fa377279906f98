"""One SQLAlchemy engine per (process, URL): pooled connections must never cross a fork."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from dtask.domain.limits import POOL_PROCESS_CONNECTIONS
from dtask.exceptions import DatabaseUnavailable
from dtask.settings import Settings


@dataclass(frozen=True)
class Limits:
    """Bounded waits for every connection, so no call hangs on a link that drops packets
    silently or on a lock nobody releases. Connection options only: no round trip is added.

    ``network_timeout``: a connection whose sent data stays unacknowledged this long, or whose
    idle peer stops answering keepalive probes for this long, is dropped by the kernel
    (``tcp_user_timeout`` and TCP keepalives); it also bounds connecting. The others are
    PostgreSQL's own timeouts in seconds (0 = none)."""

    network_timeout: float = 8.0
    statement_timeout: float = 60.0
    lock_timeout: float = 30.0
    idle_in_transaction_timeout: float = 60.0
    connections: int = 4  # per engine: its pool's size, and no overflow beyond it

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            network_timeout=settings.network_timeout,
            statement_timeout=settings.db_statement_timeout,
            lock_timeout=settings.db_lock_timeout,
            idle_in_transaction_timeout=settings.db_idle_in_transaction_timeout,
            connections=POOL_PROCESS_CONNECTIONS if _pool_process else settings.db_pool,
        )

    @property
    def pool_wait(self) -> float:
        """How long a thread waits for a connection of a full pool: as long as a statement of
        another thread may hold one."""
        return max(self.statement_timeout, self.lock_timeout, 5.0)

    def connect_args(self) -> dict[str, Any]:
        net = self.network_timeout
        return {
            "connect_timeout": max(2, math.ceil(net)),  # libpq counts whole seconds, from 2
            "keepalives": 1,
            "keepalives_idle": max(1, int(net / 2)),
            "keepalives_interval": max(1, int(net / 4)),
            "keepalives_count": 3,
            "tcp_user_timeout": int(net * 1000),
        }

    def options(self) -> list[str]:
        timeouts = {
            "statement_timeout": self.statement_timeout,
            "lock_timeout": self.lock_timeout,
            "idle_in_transaction_session_timeout": self.idle_in_transaction_timeout,
        }
        # psycopg prepares a statement run five times, and PostgreSQL then keeps a generic plan
        # made with the statistics of that moment: one made when dtask_children held a hundred
        # rows scans it whole at a hundred thousand (a child's claim and finish took twice as
        # long until autovacuum's ANALYZE threw the plan away). Plan each execution instead.
        return [
            *(f"-c {name}={int(seconds * 1000)}" for name, seconds in timeouts.items()),
            "-c plan_cache_mode=force_custom_plan",
        ]


_engines: dict[tuple[int, str, bool, bool, Limits], Engine] = {}
_lock = threading.Lock()
_pool_process = False


def as_pool_process() -> None:
    """This process is a worker's pool process, which runs one child at a time: its engines
    keep POOL_PROCESS_CONNECTIONS each (what the connection budget counts on)."""
    global _pool_process
    _pool_process = True


def engine_for(
    url: str, durable: bool = True, owner: bool = False, limits: Limits = Limits()
) -> Engine:
    """The process's engine for ``url``, its connections bounded by ``limits``.

    ``owner=True`` is for a child owner's own single-statement writes, the statements every
    child runs: autocommit, and connections pinged only after sitting idle (the callers retry a
    write that still finds its connection dead). With ``durable=False`` as well, its sessions
    commit without waiting for the WAL flush (heartbeats, finish, release: losing one in a
    crash is safe, the fence and the lease see to it). Everything else pings on every checkout
    (pool_pre_ping), so a PostgreSQL restart never fails a client's read or a run transition."""
    key = (os.getpid(), url, durable, owner, limits)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            connect_args: dict[str, Any] = {
                **limits.connect_args(),
                # the pid lets operators (and fault tests) map a backend to its process
                "application_name": f"dtask:{os.getpid()}",
            }
            server_options = limits.options()
            options: dict[str, Any] = {}
            if owner:
                options["isolation_level"] = "AUTOCOMMIT"  # single-statement writes only
                if not durable:
                    server_options.append("-c synchronous_commit=off")
            connect_args["options"] = " ".join(server_options)
            engine = create_engine(
                url,
                pool_pre_ping=not owner,
                pool_use_lifo=True,  # the hot connection is reused, the spare ones go idle
                pool_size=limits.connections,
                max_overflow=0,  # the budget (docs/security.md) counts on this bound
                pool_timeout=limits.pool_wait,
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
