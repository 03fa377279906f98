"""Migration 0027: rows stored before durations and moments were bounded (a deadline in the
year 33715, a countdown past 9999) are carried over readable, and PostgreSQL refuses any new
moment psycopg could not read."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DataError, IntegrityError

from tests.integration.test_migration_keys_per_client import alembic
from tests.integration.test_migrations import assert_at_head_matching_models
from tests.support.db import new_database

INSERT = (
    "INSERT INTO dtask_runs (template, trigger_key, variables, max_attempts, delay_tolerance,"
    " deadline, execution_cap, start_after) VALUES ('t', :key, '{}', 1, :tolerance,"
    " now() + make_interval(secs => :tolerance), :cap, :start) RETURNING id"
)


@pytest.fixture
def at_0026(dtask_env: dict[str, str]) -> Iterator[str]:
    with new_database("moments") as url:
        alembic(url, "upgrade", "0026", check=True)
        yield url


def test_upgrade_makes_every_stored_moment_readable(at_0026: str) -> None:
    engine = create_engine(at_0026)
    try:
        with engine.begin() as conn:
            evil = conn.execute(
                text(INSERT),
                {"key": "evil", "tolerance": 1e12, "cap": 1e300, "start": None},
            ).scalar_one()
            far = conn.execute(
                text(INSERT),
                {"key": "far", "tolerance": 60, "cap": None, "start": "9999-06-01T00:00:00Z"},
            ).scalar_one()
            ok = conn.execute(
                text(INSERT), {"key": "ok", "tolerance": 60, "cap": 30, "start": None}
            ).scalar_one()
        with engine.connect() as conn, pytest.raises(DataError, match="year"):
            conn.execute(text("SELECT deadline FROM dtask_runs")).all()  # what broke dispatch

        alembic(at_0026, "upgrade", "head", check=True)
        assert_at_head_matching_models(at_0026)
        with engine.connect() as conn:
            rows = {
                r.id: r
                for r in conn.execute(
                    text(
                        "SELECT id, deadline, delay_tolerance, execution_cap, start_after,"
                        " created_at FROM dtask_runs"
                    )
                )
            }  # every row reads
        assert rows[evil].delay_tolerance == 10 * 365 * 86400
        assert rows[evil].execution_cap == 10 * 365 * 86400
        assert rows[evil].deadline.year == rows[evil].created_at.year + 10
        assert rows[far].start_after.year == 9000
        assert (rows[ok].delay_tolerance, rows[ok].execution_cap) == (60, 30)

        with engine.begin() as conn, pytest.raises(IntegrityError, match="deadline_readable"):
            conn.execute(
                text(INSERT), {"key": "again", "tolerance": 1e12, "cap": None, "start": None}
            )
    finally:
        engine.dispose()
