"""Migration 0026: trigger keys unique per client. A database at 0025 with runs keeps them all;
afterwards a key is unique per client only; a downgrade refuses in one line while two clients
share a key, and restores the global uniqueness once they do not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import IntegrityError

from dtask.db import schema
from tests.conftest import REPO
from tests.integration.test_migrations import assert_at_head_matching_models
from tests.support.db import new_database

RUNS = [("api-a", "nightly-1"), ("api-b", "nightly-2"), ("default", "adhoc:1")]


@pytest.fixture
def at_0025(dtask_env: dict[str, str]) -> Iterator[str]:
    with new_database("keys") as url:
        alembic(url, "upgrade", "0025", check=True)
        yield url


def alembic(url: str, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "alembic", *args], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "DTASK_DATABASE_URL": url}, timeout=120, check=False,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, done.stderr
    return done


def insert(engine: Engine, client: str, key: str) -> int:
    with engine.begin() as conn:
        return int(
            conn.execute(
                text(
                    "INSERT INTO dtask_runs (template, trigger_key, variables, max_attempts,"
                    " client) VALUES ('t', :key, '{}', 1, :client) RETURNING id"
                ),
                {"key": key, "client": client},
            ).scalar_one()
        )


def runs(engine: Engine) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, client, trigger_key FROM dtask_runs ORDER BY id"))
        return [(int(r.id), r.client, r.trigger_key) for r in rows]


def test_upgrade_keeps_the_runs_and_makes_keys_unique_per_client(at_0025: str) -> None:
    engine = create_engine(at_0025)
    try:
        before = [(insert(engine, c, k), c, k) for c, k in RUNS]
        alembic(at_0025, "upgrade", "head", check=True)
        assert_at_head_matching_models(at_0025)
        assert runs(engine) == before

        shared = insert(engine, "api-b", "nightly-1")  # a's key, now b's too
        assert shared not in [r[0] for r in before]
        with pytest.raises(IntegrityError, match="uq_dtask_runs_client_trigger_key"):
            insert(engine, "api-a", "nightly-1")  # still once per client

        refused = alembic(at_0025, "downgrade", "0025")
        assert refused.returncode != 0
        assert "trigger key 'nightly-1' is used by 2 clients" in refused.stderr, refused.stderr
        assert schema.current_revision(engine) == schema.HEAD  # nothing was undone
        assert runs(engine) == [*before, (shared, "api-b", "nightly-1")]

        with engine.begin() as conn:
            conn.execute(text("DELETE FROM dtask_runs WHERE id = :id"), {"id": shared})
        alembic(at_0025, "downgrade", "0025", check=True)
        assert runs(engine) == before
        with pytest.raises(IntegrityError, match="uq_dtask_runs_trigger_key"):
            insert(engine, "api-b", "nightly-1")  # unique across clients again
    finally:
        engine.dispose()
