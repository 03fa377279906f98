"""A pooler between dtask and PostgreSQL that hands each transaction whichever server
connection is free (PgBouncer in transaction mode, as Django and Celery shops run it): such a
pooler refuses, or silently drops, the session settings dtask sends when connecting, and a
statement psycopg prepared on one server connection is unknown on the next.

Behind one (DTASK_DB_POOLER=transaction, or found by ``auto``), a connection sends no startup
options and prepares nothing, and each transaction sets its own bounds (``bounds``). A
single-statement autocommit write then has only the network's bound and the pooler's own
``query_timeout`` (docs/scaling.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import ConnectionPoolEntry

from dtask.db import watchdog
from dtask.settings import shown_url

log = logging.getLogger(__name__)

PLANNED_EACH_TIME = "force_custom_plan"  # plan_cache_mode as dtask's startup options set it
POOLED = "dtask_pooled"  # in a connection's info: it goes through a transaction pooler
_behind: set[str] = set()  # URLs this process found behind a pooler

BOUNDS = (
    "SELECT set_config('statement_timeout', :statement_timeout, true),"
    " set_config('lock_timeout', :lock_timeout, true),"
    " set_config('idle_in_transaction_session_timeout',"
    " :idle_in_transaction_session_timeout, true)"
)
"""What each transaction runs first behind a pooler: the bounds a direct connection gets once
(``Limits.options``), for this transaction only."""


def pooled(info: dict[Any, Any]) -> bool:
    return bool(info.get(POOLED))


def watch(engine: Engine, mode: str, options: str, network_timeout: float) -> None:
    """Connect ``engine`` as ``mode`` (DTASK_DB_POOLER) says: ``none`` straight to PostgreSQL
    with the startup ``options``, ``transaction`` through a pooler, ``auto`` straight unless
    the server refuses or drops the options (then as through a pooler, said once in the
    log). Either way each connection's round trips are bounded by ``network_timeout`` on this
    process's clock (dtask.db.watchdog)."""
    where = shown_url(engine.url)

    def connect(dialect: Any, *cargs: Any, **cparams: Any) -> Any:
        if dialect.driver != "psycopg":
            return dialect.connect(*cargs, **cparams)
        return watchdog.connect(where, network_timeout, *cargs, **cparams)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: ConnectionPoolEntry, cargs: Any, cparams: Any) -> Any:
        if mode == "none" or (mode == "auto" and where not in _behind):
            try:
                return connect(dialect, *cargs, **cparams, options=options)
            except psycopg.OperationalError as exc:
                if mode == "none" or "unsupported startup parameter" not in str(exc):
                    raise
                _found(where, "refused dtask's startup options")
        record.info[POOLED] = True
        return connect(dialect, *cargs, **cparams, prepare_threshold=None)

    if mode == "auto":

        @event.listens_for(engine, "connect")
        def _check(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
            if pooled(record.info):
                return
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('plan_cache_mode')")
                planned = cursor.fetchone()[0]
            dbapi_connection.rollback()
            if planned != PLANNED_EACH_TIME:
                _found(where, "dropped dtask's startup options")
                dbapi_connection.prepare_threshold = None
                record.info[POOLED] = True


def _found(where: str, what: str) -> None:
    if where not in _behind:
        _behind.add(where)
        log.warning(
            "dtask: %s %s: connecting as through a transaction pooler (no startup options,"
            " nothing prepared, bounds set per transaction); DTASK_DB_POOLER=transaction"
            " says so up front",
            where,
            what,
        )


@dataclass(frozen=True)
class ClientLimit:
    """What a pooler lets clients hold: ``most`` (PgBouncer's ``max_client_conn``) and how
    many are connected now."""

    most: int
    in_use: int


def client_limit(url: str, timeout: float) -> ClientLimit | str:
    """The pooler's client limit, from its admin console (database ``pgbouncer`` at the same
    address, for a user in its ``admin_users`` or ``stats_users``), or why it cannot be read."""
    console = make_url(url).set(drivername="postgresql", database="pgbouncer")
    try:
        with psycopg.connect(
            console.render_as_string(hide_password=False),
            autocommit=True,
            prepare_threshold=None,
            connect_timeout=max(2, int(timeout)),
        ) as conn:
            cursor = psycopg.ClientCursor(conn)  # the console speaks the simple protocol only
            cursor.execute("SHOW CONFIG")
            config = {str(row[0]): str(row[1]) for row in cursor.fetchall()}
            cursor.execute("SHOW LISTS")
            lists = {str(row[0]): int(row[1]) for row in cursor.fetchall()}
        return ClientLimit(int(config["max_client_conn"]), lists.get("used_clients", 0))
    except (psycopg.Error, KeyError, ValueError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
