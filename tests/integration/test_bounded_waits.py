"""Every connection has bounded waits (issue 15, hole 7): PostgreSQL's statement, lock and
idle-in-transaction limits, and TCP keepalive / user timeout against links that drop packets."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Database, Limits, engine_for
from dtask.db.database import RUN_LOCKS, lock_run
from dtask.exceptions import DatabaseUnavailable

LIMITS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


def test_the_store_s_sessions_have_the_default_limits(dtask_env: dict[str, str]) -> None:
    db = services.store().db
    for connect in (db.tx, db.owner):
        with connect() as conn:
            shown = {name: conn.execute(text(f"SHOW {name}")).scalar() for name in LIMITS}
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
        assert shown == {
            "statement_timeout": "1min",
            "lock_timeout": "30s",
            "idle_in_transaction_session_timeout": "1min",
        }
        assert params["keepalives"] == "1" and params["tcp_user_timeout"] == "8000"
        assert params["connect_timeout"] == "8"


def test_a_lock_nobody_releases_fails_the_waiter_within_the_lock_timeout(
    dtask_env: dict[str, str],
) -> None:
    url = services.database_url()
    holder = services.store().engine.connect()
    holder.execute(text("SELECT pg_advisory_lock(:ns, 424242)"), {"ns": RUN_LOCKS})
    try:
        db = Database(engine_for(url, limits=Limits(lock_timeout=0.5)))
        started = time.monotonic()
        with pytest.raises(DatabaseUnavailable, match=r"lock timeout.*55P03"), db.tx() as conn:
            lock_run(conn, 424242)
        assert time.monotonic() - started < 5
    finally:
        holder.execute(text("SELECT pg_advisory_unlock(:ns, 424242)"), {"ns": RUN_LOCKS})
        holder.close()


def test_a_statement_past_its_limit_is_cancelled(dtask_env: dict[str, str]) -> None:
    db = Database(engine_for(services.database_url(), limits=Limits(statement_timeout=0.5)))
    with pytest.raises(DatabaseUnavailable, match=r"statement timeout.*57014"), db.tx() as conn:
        conn.execute(text("SELECT pg_sleep(5)"))
