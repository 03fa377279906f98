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
from typing import Any

import psycopg
from sqlalchemy import Engine, event
from sqlalchemy.pool import ConnectionPoolEntry

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


def watch(engine: Engine, mode: str, options: str) -> None:
    """Connect ``engine`` as ``mode`` (DTASK_DB_POOLER) says: ``none`` straight to PostgreSQL
    with the startup ``options``, ``transaction`` through a pooler, ``auto`` straight unless
    the server refuses or drops the options (then as through a pooler, said once in the
    log)."""
    where = engine.url.render_as_string(hide_password=True)

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: ConnectionPoolEntry, cargs: Any, cparams: Any) -> Any:
        if mode == "none" or (mode == "auto" and where not in _behind):
            try:
                return dialect.connect(*cargs, **cparams, options=options)
            except psycopg.OperationalError as exc:
                if mode == "none" or "unsupported startup parameter" not in str(exc):
                    raise
                _found(where, "refused dtask's startup options")
        record.info[POOLED] = True
        return dialect.connect(*cargs, **cparams, prepare_threshold=None)

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
