"""The caller's database: a submit written in the caller's own transaction (its connection
lent to dtask for the statements of one submit), and a store that keeps no connection open
between its transactions (eager runs in a test database, which its test runner drops at the
end: an idle pooled connection would make the drop fail)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.types.json import JsonbLoader, JsonLoader
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from dtask.db import pooler, schema
from dtask.db.database import Database
from dtask.db.engine import Limits
from dtask.db.runs import Reducer, RunStore
from dtask.db.store import Store
from dtask.domain.runs import RunState
from dtask.exceptions import ConfigurationError

_lent: ContextVar[psycopg.Connection[Any]] = ContextVar("dtask_lent_connection")
_lock = threading.Lock()
_engines: dict[int, Engine] = {}


class _Lent:
    """The caller's psycopg connection as SQLAlchemy sees it: the statements go through it,
    but its transaction stays the caller's (committed or rolled back by the caller only), and
    it stays open."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:  # a failed statement: the caller's savepoint undoes it
        pass

    def close(self) -> None:
        pass

    def add_notice_handler(self, handler: Callable[..., Any]) -> None:
        pass  # SQLAlchemy adds one per checkout: it would pile up on the caller's connection

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        cursor = self._raw.cursor(*args, **kwargs)
        # Django loads jsonb as text (its JSONField parses it): dtask's reads want the JSON.
        # A cursor's adapters are its own copy: the caller's connection is left as it was.
        cursor.adapters.register_loader("jsonb", JsonbLoader)
        cursor.adapters.register_loader("json", JsonLoader)
        return cursor


def _lent_engine() -> Engine:
    """One engine per process whose every connection is the lent one of the current context
    (no pool: nothing is kept, reset or closed)."""
    pid = os.getpid()
    with _lock:
        engine = _engines.get(pid)
        if engine is None:
            engine = create_engine(
                "postgresql+psycopg://",
                creator=lambda: _Lent(_lent.get()),
                poolclass=NullPool,
                pool_reset_on_return=None,
                use_native_hstore=False,
            )
            _engines[pid] = engine
        return engine


@contextmanager
def lend(connection: Any, savepoint: bool = True) -> Iterator[Connection]:
    """The caller's ``connection`` (a psycopg 3 connection, or a SQLAlchemy ``Connection``) as
    a SQLAlchemy ``Connection`` whose statements are part of the caller's transaction. With
    ``savepoint``, they are inside a savepoint of it (its own transaction when there is none),
    so a submit that fails leaves the caller's transaction usable; without, the caller has
    made one (Django's ``transaction.atomic``)."""
    if isinstance(connection, Connection):
        if not savepoint:
            yield connection
        elif connection.in_transaction():
            with connection.begin_nested():
                yield connection
        else:
            with connection.begin():
                yield connection
        return
    if not isinstance(connection, psycopg.Connection):
        raise ConfigurationError(
            f"dtask cannot write on {type(connection).__module__}.{type(connection).__name__}:"
            " pass a psycopg 3 connection, a SQLAlchemy Connection, or a Django database alias"
            " (using=...)"
        )
    if connection.closed:
        raise ConfigurationError("the connection given to dtask's submit is closed")
    token = _lent.set(connection)
    try:
        idle = connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # a connection without autocommit begins the caller's transaction with the first
        # statement: psycopg's transaction() would commit it at its end
        own = savepoint and (connection.autocommit or not idle)
        with connection.transaction() if own else _nothing(), _lent_engine().connect() as conn:
            yield conn
    finally:
        _lent.reset(token)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def check_shared(conn: Connection, database: str | None) -> None:
    """Refuse a caller's connection whose database is not dtask's (its run would be written
    where no worker looks), or that has no dtask tables."""
    row = conn.exec_driver_sql(
        "SELECT current_database(), to_regclass('dtask_runs') IS NOT NULL"
    ).one()
    if database is not None and row[0] != database:
        raise ConfigurationError(
            f"the connection given to submit is to database {row[0]!r}, dtask's is {database!r}:"
            " a submit on the caller's connection needs dtask's tables in the caller's database"
        )
    if not row[1]:
        raise ConfigurationError(
            f"database {row[0]!r} of the connection given to submit has no dtask tables: run"
            " `dtask migrate` on it"
        )


def database_name(url: str) -> str | None:
    """The database a URL names (None: the server's default for the user)."""
    from sqlalchemy.engine import make_url

    return make_url(url).database


def django_url(params: Mapping[str, Any]) -> str | None:
    """A URL for the database a Django connection's settings describe (ENGINE, NAME, USER,
    PASSWORD, HOST, PORT), None where it is not PostgreSQL."""
    if "postgresql" not in str(params.get("ENGINE", "")) or not params.get("NAME"):
        return None
    host = str(params.get("HOST") or "")
    query = {"host": host} if host.startswith("/") else {}
    return URL.create(
        "postgresql+psycopg",
        username=params.get("USER") or None,
        password=params.get("PASSWORD") or None,
        host=None if query or not host else host,
        port=int(params["PORT"]) if params.get("PORT") else None,
        database=str(params["NAME"]),
        query=query,
    ).render_as_string(hide_password=False)


class _ChordlessRuns(RunStore):
    """Runs whose children were never sent (an eager run's): finalizing one leaves the result
    backend alone (there is no chord to forget)."""

    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = lambda template: True,
    ) -> RunState:
        return super().finalize(run_id, wait, reduce, released, None, reduces)


_unpooled: dict[tuple[int, str, Limits], Store] = {}


def unpooled_store(url: str, limits: Limits) -> Store:
    """A store for ``url`` that holds no connection between transactions (one per process),
    its schema brought to HEAD on first use, whose runs have no chord (eager runs)."""
    key = (os.getpid(), url, limits)
    with _lock:
        made = _unpooled.get(key)
        if made is not None:
            return made
        engine = create_engine(
            url,
            poolclass=NullPool,
            connect_args={**limits.connect_args(), "application_name": f"dtask:{os.getpid()}"},
        )
        pooler.watch(engine, limits.pooler, limits.options(), limits.network_timeout)
        schema.ensure(engine, migrate=True)
        store = Store(Database(engine, limits))
        store.runs = _ChordlessRuns(store.db)
        _unpooled[key] = store
        return store
