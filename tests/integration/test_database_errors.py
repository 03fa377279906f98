"""Errors of the database layer name their real cause."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from sqlalchemy import text

from dtask import services
from dtask.db.database import Database
from dtask.db.engine import Limits, engine_for
from dtask.exceptions import DatabaseUnavailable


def test_a_deadlock_is_named_as_one_not_as_an_unreachable_server(
    dtask_env: dict[str, str],
) -> None:
    db = Database(services.store().engine)
    with db.tx() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS deadlock_probe (id int PRIMARY KEY)"))
        conn.execute(text("INSERT INTO deadlock_probe VALUES (1), (2) ON CONFLICT DO NOTHING"))
    both_locked_one = threading.Barrier(2, timeout=30)
    errors: list[Exception] = []

    def lock(first: int, second: int) -> None:
        try:
            with db.tx() as conn:
                conn.execute(
                    text("SELECT 1 FROM deadlock_probe WHERE id = :i FOR UPDATE"), {"i": first}
                )
                both_locked_one.wait()
                conn.execute(
                    text("SELECT 1 FROM deadlock_probe WHERE id = :i FOR UPDATE"), {"i": second}
                )
        except DatabaseUnavailable as exc:
            errors.append(exc)

    threads = [threading.Thread(target=lock, args=pair) for pair in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(errors) == 1
    message = str(errors[0])
    assert "deadlock detected" in message and "SQLSTATE 40P01" in message
    assert "cannot reach" not in message and "is it running" not in message


def test_an_unreachable_server_is_still_called_unreachable() -> None:
    from dtask.db import engine_for

    db = Database(engine_for("postgresql+psycopg://nobody@127.0.0.1:9/none"))
    unreachable = r"cannot reach PostgreSQL at .*is it running"
    with pytest.raises(DatabaseUnavailable, match=unreachable), db.tx() as conn:
        conn.execute(text("SELECT 1"))


def test_an_engine_never_holds_more_than_its_pool_and_a_full_pool_is_named(
    dtask_env: dict[str, str],
) -> None:
    """Each engine stops at DTASK_DB_POOL connections (the connection budget counts on it): a
    thread that finds them all busy waits, then gets a one-line DatabaseUnavailable."""
    limits = Limits(statement_timeout=0, lock_timeout=0, connections=2)
    assert limits.pool_wait == 5.0
    db = Database(engine_for(services.database_url(), limits=limits))
    with db.tx(), db.tx():
        started = time.monotonic()
        full = r"^all 2 PostgreSQL connections of this"
        with pytest.raises(DatabaseUnavailable, match=full), db.tx():
            pass
        assert time.monotonic() - started >= 4.5
    with db.tx() as conn:  # given back: usable again
        assert conn.execute(text("SELECT 1")).scalar_one() == 1


def test_ctrl_c_in_a_checkout_ping_is_not_taken_for_a_lost_connection(
    dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a transaction's ping runs: SQLAlchemy's do_ping then fails to set
    autocommit back on the interrupted connection (ProgrammingError, "connection in
    transaction status ACTIVE"), which hides the KeyboardInterrupt. Taken for a lost
    connection, the checkout was retried on a fresh one and `dtask submit --wait` went on
    waiting after Ctrl-C (seen in test_first_hour under load)."""
    limits = Limits(connections=1)
    engine = engine_for(services.database_url(), limits=limits)
    db = Database(engine, limits)
    with db.tx():
        pass  # now an idle pooled connection, pinged at the next checkout

    def ping(dbapi_connection: object) -> bool:
        try:
            raise KeyboardInterrupt
        finally:
            raise psycopg.ProgrammingError("can't change 'autocommit' now: ACTIVE")

    monkeypatch.setattr(engine.dialect, "do_ping", ping)
    with pytest.raises(KeyboardInterrupt), db.tx():
        pass
    monkeypatch.undo()
    with db.tx() as conn:  # the pool goes on
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
