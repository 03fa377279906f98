"""A PostgreSQL crash (immediate shutdown) must never move a child's fence backwards: two
owners holding the same fence could both write. Runs on a private embedded PostgreSQL whose WAL
writer is slowed down, so an asynchronous commit is still unflushed when it crashes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy import Engine, text

from dtask.db import Claim, Database, Store, engine_for, schema
from dtask.domain.runs import NewRun
from dtask.exceptions import DatabaseUnavailable
from dtask.services import embedded

T = TypeVar("T")


@pytest.fixture
def crashable(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    home = tmp_path / "crashable"
    url = embedded.postgres_url(home)
    try:
        with engine_for(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ALTER SYSTEM SET wal_writer_delay = '10s'"))
            conn.execute(text("SELECT pg_reload_conf()"))
        schema.upgrade(engine_for(url))
        yield home, url
    finally:
        engine_for(url).dispose()
        embedded.stop(home)


def fence(store: Store, run_id: int) -> int:
    with store.db.tx() as conn:
        value = conn.execute(
            text("SELECT fence FROM dtask_children WHERE run_id = :r"), {"r": run_id}
        ).scalar_one()
    return int(value)


def test_a_claimed_fence_survives_a_crash(crashable: tuple[Path, str]) -> None:
    home, url = crashable
    store = Store(Database(engine_for(url)))
    run_id, _ = store.runs.create(NewRun("print_range", f"crash:{uuid.uuid4()}", {"n": 1}, 3, None))
    store.runs.split(run_id, lambda run, slots: [{"a": 1, "b": 1}])
    store.runs.dispatch(run_id, lambda run, todo: None)
    claim = store.children.claim(run_id, 0, "owner:1", 30)
    assert isinstance(claim, Claim) and claim.fence == 1
    store.children.renew_lease(claim, 30)  # asynchronous writes may be lost: that is allowed
    embedded.restart_postgres(home, crash=True)
    assert fence(store, run_id) == 1
    sql("UPDATE dtask_children SET lease_expires_at = now() - interval '1 s'", store.engine)
    again = retried(lambda: store.children.claim(run_id, 0, "owner:2", 30))
    assert isinstance(again, Claim) and again.fence == 2


def test_an_owner_s_lease_write_is_not_waited_for_and_its_checkpoint_is(
    crashable: tuple[Path, str],
) -> None:
    """Both go on the same pooled connection: the asynchronous commit is the statement's own
    setting, and nothing of it stays on the session."""
    _, url = crashable
    store = Store(Database(engine_for(url)))
    run_id, _ = store.runs.create(NewRun("print_range", f"lsn:{uuid.uuid4()}", {"n": 1}, 3, None))
    store.runs.split(run_id, lambda run, slots: [{"a": 1, "b": 1}])
    store.runs.dispatch(run_id, lambda run, todo: None)
    claim = store.children.claim(run_id, 0, "owner:1", 30)
    assert isinstance(claim, Claim)

    def flushed_after(write: Callable[[], object]) -> bool:
        write()
        with store.db.owner() as conn:
            assert conn.execute(text("SHOW synchronous_commit")).scalar() == "on"
            return bool(
                conn.execute(
                    text("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")
                ).scalar()
            )

    assert not flushed_after(lambda: store.children.renew_lease(claim, 30))
    assert flushed_after(lambda: store.children.checkpoint(claim, {"done": 1}, 30))
    assert not flushed_after(lambda: store.children.renew_lease(claim, 30))


def retried(call: Callable[[], T]) -> T:
    """As the worker does: a pooled connection that died in the crash fails one write."""
    for _ in range(3):
        try:
            return call()
        except DatabaseUnavailable:
            continue
    return call()


def sql(statement: str, engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(statement))
