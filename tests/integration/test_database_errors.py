"""Errors of the database layer name their real cause."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db.database import Database
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
