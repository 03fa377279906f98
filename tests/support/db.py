"""Reading dtask's tables from tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from sqlalchemy import create_engine, text

from dtask import services


class ChildRow(NamedTuple):
    owner: str | None
    state: str
    attempt: int
    checkpoint: Any


def run_count() -> int:
    with services.store().engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM dtask_runs")).scalar_one())


def child_row(run_id: int, index: int) -> ChildRow:
    """One child; state "absent" before the master has split."""
    with services.store().engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT owner, state, attempt, checkpoint FROM dtask_children"
                " WHERE run_id = :r AND index = :i"
            ),
            {"r": run_id, "i": index},
        ).first()
    if row is None:
        return ChildRow(None, "absent", 0, None)
    return ChildRow(row.owner, row.state, row.attempt, row.checkpoint)


def children(run_id: int) -> list[tuple[int, str, int]]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT index, state, attempt FROM dtask_children WHERE run_id = :r ORDER BY index"
            ),
            {"r": run_id},
        )
        return [(int(i), str(s), int(a)) for i, s, a in rows]


def owner_pid(owner: str) -> int:
    return int(owner.rsplit(":", 1)[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@contextmanager
def new_database(prefix: str) -> Iterator[str]:
    """A new, empty database in the session's PostgreSQL (dropped afterwards): its URL."""
    admin = create_engine(services.database_url(), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield services.database_url().replace("/postgres?", f"/{name}?")
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def add_host_history(url: str, revision: str) -> None:
    """What an application keeps in its database: its own table and Alembic history."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": revision})
        conn.execute(text("CREATE TABLE orders (id serial PRIMARY KEY)"))
    engine.dispose()
