"""``dtask.submit(..., connection=...)``: the run is written in the caller's own transaction (a
psycopg 3 connection, a SQLAlchemy Connection), so the caller's rollback leaves no run and its
commit leaves one, with the same once-per-key and rate-limit checks as any submit. Without a
commit hook nothing is sent (the broker here is a port nothing listens on): the reaper starts
a committed run (tests/acceptance/test_django_transactions.py runs them with Django)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text

import dtask
from dtask import services


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _runs_of(key: str) -> list[tuple[int, str]]:
    with services.store().db.tx() as conn:
        rows = conn.execute(
            text("SELECT id, state FROM dtask_runs WHERE trigger_key = :k"), {"k": key}
        ).all()
    return [(int(r.id), str(r.state)) for r in rows]


def test_a_psycopg_transaction_that_rolls_back_leaves_no_run(no_broker: None) -> None:
    key = f"conn-{uuid.uuid4()}"
    with psycopg.connect(_libpq(services.database_url())) as conn:
        run = dtask.submit("print_range", {"n": 5}, key=key, connection=conn)
        again = dtask.submit("print_range", {"n": 5}, key=key, connection=conn)
        assert (again.id, again.created) == (run.id, False)  # once per key, in there too
        assert _runs_of(key) == []  # not committed: nobody else sees it
        conn.rollback()
    assert _runs_of(key) == []
    with pytest.raises(dtask.RunNotFound):
        dtask.get_run(run.id)


def test_a_psycopg_transaction_that_commits_leaves_a_pending_run(no_broker: None) -> None:
    key = f"conn-{uuid.uuid4()}"
    with psycopg.connect(_libpq(services.database_url())) as conn:
        conn.execute("SELECT 1")  # the caller's transaction is open
        run = dtask.submit("print_range", {"n": 5}, key=key, connection=conn)
        conn.commit()
    assert _runs_of(key) == [(run.id, "pending")]  # its master is the reaper's to send


def test_a_sqlalchemy_connection_and_a_rate_limit_inside_the_caller_s_transaction(
    no_broker: None,
) -> None:
    client = f"c{uuid.uuid4().hex[:8]}"
    dtask.set_client(client, rate="1/h")
    engine = create_engine(services.database_url())
    first, second = f"conn-{uuid.uuid4()}", f"conn-{uuid.uuid4()}"
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            dtask.submit("print_range", {"n": 5}, key=first, client=client, connection=conn)
            with pytest.raises(dtask.RateLimited):
                dtask.submit("print_range", {"n": 5}, key=second, client=client, connection=conn)
            conn.execute(text("SELECT 1"))  # still usable: the refusal was a savepoint's
            conn.commit()
        assert [state for _, state in _runs_of(first)] == ["pending"]
        assert _runs_of(second) == []
        with engine.connect() as conn:
            conn.begin()
            gone = f"conn-{uuid.uuid4()}"
            dtask.submit("print_range", {"n": 5}, key=gone, connection=conn)
            conn.rollback()
        assert _runs_of(gone) == []
    finally:
        engine.dispose()
        dtask.remove_client(client)


def test_a_connection_without_dtask_s_tables_is_refused(no_broker: None) -> None:
    with psycopg.connect(_libpq(services.database_url()), autocommit=True) as admin:
        name = f"other_{uuid.uuid4().hex[:8]}"
        admin.execute(f"CREATE DATABASE {name}")
        try:
            url = psycopg.conninfo.make_conninfo(_libpq(services.database_url()), dbname=name)
            with psycopg.connect(url) as conn, pytest.raises(dtask.ConfigurationError):
                dtask.submit("print_range", {"n": 5}, connection=conn)
        finally:
            admin.execute(f"DROP DATABASE {name}")
