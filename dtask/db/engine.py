"""One SQLAlchemy engine per (process, URL): pooled connections must never cross a fork."""

from __future__ import annotations

import math
import os
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.pool import ConnectionPoolEntry

from dtask.db import pooler
from dtask.domain.limits import MAIN_PROCESS_CONNECTIONS, POOL_PROCESS_CONNECTIONS
from dtask.exceptions import DatabaseUnavailable
from dtask.settings import Settings, shown_url


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
    connections: int = 4  # the process's pool: its size, and no overflow beyond it
    pooler: str = "auto"  # DTASK_DB_POOLER: "auto", "none" or "transaction"

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(
            network_timeout=settings.network_timeout,
            statement_timeout=settings.db_statement_timeout,
            lock_timeout=settings.db_lock_timeout,
            idle_in_transaction_timeout=settings.db_idle_in_transaction_timeout,
            connections=_own_size or settings.db_pool,
            pooler=settings.db_pooler,
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

    def timeouts(self) -> dict[str, str]:
        """PostgreSQL's settings for the bounds, in milliseconds."""
        return {
            "statement_timeout": str(int(self.statement_timeout * 1000)),
            "lock_timeout": str(int(self.lock_timeout * 1000)),
            "idle_in_transaction_session_timeout": str(
                int(self.idle_in_transaction_timeout * 1000)
            ),
        }

    def options(self) -> str:
        """The session settings sent when connecting straight to PostgreSQL. psycopg prepares
        a statement run five times, and PostgreSQL then keeps a generic plan made with the
        statistics of that moment: one made when dtask_children held a hundred rows scans it
        whole at a hundred thousand (a child's claim and finish took twice as long until
        autovacuum's ANALYZE threw the plan away). So each execution is planned instead."""
        settings = {**self.timeouts(), "plan_cache_mode": pooler.PLANNED_EACH_TIME}
        return " ".join(f"-c {name}={value}" for name, value in settings.items())


_engines: dict[tuple[int, str, Limits], Engine] = {}
_lock = threading.Lock()
_own_size: int | None = None  # this process's pool size where its role sets one


def as_pool_process() -> None:
    """This process is a worker's pool process, which runs one child at a time: its engine
    keeps POOL_PROCESS_CONNECTIONS (what the connection budget counts on)."""
    global _own_size
    _own_size = POOL_PROCESS_CONNECTIONS


def as_prefork_main() -> None:
    """This process is the main process of a prefork worker, whose children run in its pool
    processes: its loops share MAIN_PROCESS_CONNECTIONS. An engine it made before (at start-up)
    is closed, so none of its connections outlives the change."""
    global _own_size
    _own_size = MAIN_PROCESS_CONNECTIONS
    with _lock:
        for key in [k for k in _engines if k[0] == os.getpid()]:
            _engines.pop(key).dispose()


def engine_for(url: str, limits: Limits = Limits()) -> Engine:
    """The process's engine for ``url``: one pool of ``limits.connections`` for transactions
    and for a child owner's single-statement writes alike (``Database.owner`` takes the same
    connections in autocommit), so a process holds at most that many.

    A transaction's connection is pinged before use (``PINGED``); an owner's statement's only
    when it sat idle for PING_AFTER_IDLE: a connection alive before a PostgreSQL restart has
    usually sat through it. When the restart was quicker, the write fails with
    DatabaseUnavailable, SQLAlchemy drops the pool's other connections of before, and the
    caller retries it on a fresh one."""
    key = (os.getpid(), url, limits)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            connect_args: dict[str, Any] = {
                **limits.connect_args(),
                # the pid lets operators (and fault tests) map a backend to its process
                "application_name": f"dtask:{os.getpid()}",
            }
            engine = create_engine(
                url,
                pool_use_lifo=True,  # the hot connection is reused, the spare ones go idle
                pool_size=limits.connections,
                max_overflow=0,  # the budget (docs/scaling.md) counts on this bound
                pool_timeout=limits.pool_wait,
                connect_args=connect_args,
            )
            _ping_idle_connections(engine)
            pooler.watch(engine, limits.pooler, limits.options(), limits.network_timeout)
            _engines[key] = engine
        return engine


PING_AFTER_IDLE = 0.5
PINGED = ContextVar("dtask_pinged", default=False)
"""Set while a transaction takes its connection: it is pinged whatever its idle time, as
``pool_pre_ping`` would, so a PostgreSQL restart fails no client's read or run transition."""


def _ping_idle_connections(engine: Engine) -> None:
    """pool_pre_ping for transactions (``PINGED``); for an owner's single statements (two per
    short child) only after the connection sat idle for PING_AFTER_IDLE."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None:  # connected just now
            return
        if not PINGED.get() and time.monotonic() - idle_since < PING_AFTER_IDLE:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            # Ctrl-C in the ping: SQLAlchemy's do_ping then fails to restore autocommit on the
            # interrupted connection, and that error hides the KeyboardInterrupt; taken for a
            # lost connection, it would be retried on a fresh one and Ctrl-C lost with it
            interruption = _interruption(exc)
            if interruption is not None:
                raise interruption from None
            raise DisconnectionError(f"connection lost while idle: {exc}") from exc


def _interruption(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt (or SystemExit) an error was raised while handling, if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if not isinstance(cause, Exception):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


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
    where = shown_url(engine.url)
    state = getattr(exc.orig, "sqlstate", None)
    if state is None or state.startswith(_CONNECTION_STATES):
        return DatabaseUnavailable(
            f"cannot reach PostgreSQL at {where}: {reason} (is it running? set DTASK_DATABASE_URL)"
        )
    return DatabaseUnavailable(f"PostgreSQL at {where} refused: {reason} (SQLSTATE {state})")
