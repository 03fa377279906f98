"""``first_row``: one statement on the driver's connection, past SQLAlchemy (a submit's insert
where the client has no rate limit). A row, or None where the statement found none or failed,
and then the caller's full path answers; a connection found dead leaves the pool."""

from __future__ import annotations

import pytest

from dtask import services
from dtask.db import Store
from dtask.db.database import first_row, sql


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def test_a_row_comes_back_as_the_driver_gives_it(store: Store) -> None:
    with store.db.owner() as conn:
        statement = sql("SELECT CAST(:a AS int) + 1, CAST(:b AS text)")
        assert tuple(first_row(conn, statement, {"a": 41, "b": "x"})) == (42, "x")
        assert first_row(conn, sql("SELECT 1 WHERE false"), {}) is None


def test_a_failed_statement_answers_none_and_the_connection_goes_on(store: Store) -> None:
    with store.db.owner() as conn:
        assert first_row(conn, sql("SELECT 1 / CAST(:zero AS int)"), {"zero": 0}) is None
        assert conn.execute(sql("SELECT 2")).scalar_one() == 2


def test_a_dead_connection_answers_none_and_leaves_the_pool(store: Store) -> None:
    with store.db.owner() as conn:
        doomed = conn.execute(sql("SELECT pg_backend_pid()")).scalar_one()
        with store.db.tx() as killer:  # and wait until it is gone
            ended = killer.execute(
                sql("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": doomed}
            ).scalar_one()
        assert ended
        assert first_row(conn, sql("SELECT pg_backend_pid()"), {}) is None
        assert conn.invalidated
    with store.db.owner() as conn:
        assert conn.execute(sql("SELECT pg_backend_pid()")).scalar_one() != doomed
