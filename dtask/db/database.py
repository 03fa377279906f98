"""Transaction plumbing shared by every store: engines, transactions, advisory locks."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache, lru_cache
from typing import Any

import psycopg
from psycopg.errors import IdleInTransactionSessionTimeout
from sqlalchemy import Connection, Dialect, Engine, TextClause, text
from sqlalchemy.exc import (
    DataError,
    InternalError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from dtask.db import pooler
from dtask.db.engine import PINGED, Limits, unreachable
from dtask.exceptions import DatabaseUnavailable, DtaskError, InvalidInput
from dtask.settings import mask

RUN_LOCKS = 0x64746B  # "dtk": keeps our advisory locks apart from the application's
REAPER_LOCK = 0x64746C
DISPATCH_LOCK = 0x64746D
KEY_LOCKS = 0x64746F  # concurrency keys (dtask.db.concurrency), one per hash of a client and key

# Statements are parsed once per process: building a TextClause costs more than a short
# child's whole UPDATE round trip.
sql = lru_cache(maxsize=None)(text)


def first_row(conn: Connection, statement: TextClause, values: Mapping[str, Any]) -> Any:
    """The first row of one statement run on the connection's driver, past SQLAlchemy (whose
    execution took a quarter of a submit's CPU), or None: no row, or any error of the driver
    (a connection found dead is dropped). The caller then takes its full path, which reports
    errors as every statement does; so only a statement that may simply be tried again
    belongs here: one that commits on its own and changes nothing where it fails."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    try:
        return driver.execute(_for_driver(statement, conn.dialect), values).fetchone()
    except psycopg.Error:
        if driver.closed or driver.broken:
            conn.invalidate()
        return None


@cache
def _for_driver(statement: TextClause, dialect: Dialect) -> str:
    return str(statement.compile(dialect=dialect))


def lock_run(conn: Connection, run_id: int, wait: bool = True) -> bool:
    """The run's advisory lock for this transaction; with ``wait=False``, only if free."""
    # Transaction-level only: session locks would leak across pooled connections.
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    result = conn.execute(
        sql(f"SELECT {function}(:ns, :key)"), {"ns": RUN_LOCKS, "key": run_id & 0x7FFFFFFF}
    ).scalar()
    return wait or bool(result)


ASYNC_COMMIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"
"""A condition that makes the statement's own commit not wait for the WAL flush (its
implicit transaction's setting, so nothing outlives it, also behind a pooler): in the WHERE
of an owner's write that may be lost in a crash (see ``Database``)."""


# undefined table, column, function: dtask's schema is missing or older than this code
_SCHEMA_BEHIND = ("42P01", "42703", "42883")


class Database:
    """``engine`` runs transactions. A child owner's writes are single conditional statements
    that commit on their own (``owner``, on the same pool), so an owner frozen mid-write
    (SIGSTOP, a paused VM) never keeps a row locked: the reaper skips locked rows and would
    otherwise never take the child over.

    What may be lost in a PostgreSQL crash commits asynchronously (``ASYNC_COMMIT``):
    heartbeats, finish, release (a lost finish leaves a lease that expires, and the child
    re-runs from its checkpoint). What may not commits durably: a claim (its fence must never
    go backwards, or two owners would hold the same fence), checkpoints, and every run
    transition; a durable commit also flushes every earlier asynchronous one."""

    def __init__(self, engine: Engine, limits: Limits | None = None) -> None:
        self.engine = engine
        self.limits = limits or Limits()
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._held = threading.local()

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        with self._one_more(), self._errors(), self._pinged(), self.engine.begin() as conn:
            if pooler.pooled(conn.info):
                conn.execute(sql(pooler.BOUNDS), self.limits.timeouts())
            yield conn

    @contextmanager
    def owner(self) -> Iterator[Connection]:
        """A connection whose every statement commits on its own (see the class)."""
        with self._one_more(), self._errors(), self._autocommit.connect() as conn:
            yield conn

    @staticmethod
    @contextmanager
    def _pinged() -> Iterator[None]:
        token = PINGED.set(True)
        try:
            yield
        finally:
            PINGED.reset(token)

    @contextmanager
    def _one_more(self) -> Iterator[None]:
        """A thread asking for more connections at once than the pool has would wait for
        itself (``pool_wait``) and then fail: it fails at once instead, naming the bug (a pool
        process has one connection, so there a transaction inside another is that bug)."""
        held = getattr(self._held, "count", 0)
        if held >= self.limits.connections:
            raise RuntimeError(
                f"this thread already holds all {held} connection(s) of its process's pool"
                " and asks for another (a transaction inside a transaction)"
            )
        self._held.count = held + 1
        try:
            yield
        finally:
            self._held.count = held

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except OperationalError as exc:
            raise unreachable(exc, self.engine) from None
        except PoolTimeout:
            size = self.engine.pool.size()  # type: ignore[attr-defined]
            raise DatabaseUnavailable(
                f"all {size} PostgreSQL connections of this process's pool stayed busy"
                " (DTASK_DB_POOL): a statement holds one too long, or the pool is too small"
            ) from None
        except DataError as exc:  # the edges check input; this is the net behind them
            reason = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
            raise InvalidInput(f"PostgreSQL cannot hold a value given: {reason}") from None
        except UnicodeEncodeError:
            raise InvalidInput("a text given is not valid UTF-8 (undecodable bytes)") from None
        except ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) in _SCHEMA_BEHIND:
                raise DatabaseUnavailable(
                    f"dtask's tables are missing in {mask(str(self.engine.url))}:"
                    " run `dtask migrate`"
                ) from None
            raise

    @contextmanager
    def held(self, hold_for: float, held_too_long: DtaskError) -> Iterator[Connection]:
        """A transaction PostgreSQL ends once it has sat idle for ``hold_for`` seconds, so a
        holder that hangs (SIGSTOP, swap, a paused VM) cannot keep its locks; the woken holder
        gets ``held_too_long`` and nothing of its transaction is recorded."""
        try:
            with self.tx() as conn:
                conn.execute(
                    sql("SELECT set_config('idle_in_transaction_session_timeout', :ms, true)"),
                    {"ms": str(int(hold_for * 1000))},
                )
                yield conn
        except InternalError as exc:
            if not isinstance(exc.orig, IdleInTransactionSessionTimeout):
                raise
            raise held_too_long from None
