"""`alembic upgrade head` on an empty database creates exactly what the models describe."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from dtask.db import schema
from dtask.db.models import Base
from tests.conftest import REPO
from tests.support.db import add_host_history, new_database


@pytest.fixture
def empty_database(dtask_env: dict[str, str]) -> Iterator[str]:
    with new_database("migration") as url:
        yield url


def assert_at_head_matching_models(url: str) -> None:
    engine = create_engine(url)
    try:
        assert schema.current_revision(engine) == schema.HEAD
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": schema.VERSION_TABLE,
                    "include_name": schema.only_dtask_tables,
                },
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_alembic_upgrade_head_matches_the_models(empty_database: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO,
        env=_env(empty_database),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert_at_head_matching_models(empty_database)


def test_concurrent_upgrades_from_many_processes_serialize(empty_database: str) -> None:
    code = (
        "import sys; from dtask.db import engine_for, schema;"
        " schema.upgrade(engine_for(sys.argv[1]))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, empty_database], stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    failures = [err for _, err in (p.communicate(timeout=60) for p in procs) if err]
    assert [p.returncode for p in procs] == [0] * 4, failures
    assert_at_head_matching_models(empty_database)


def _env(database_url: str) -> dict[str, str]:
    return {**os.environ, "DTASK_DATABASE_URL": database_url}


HOST_REVISION = "1a2b3c4d5e6f"  # an application's own Alembic head, in the same database


def _dtask(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    dtask = str(Path(sys.executable).with_name("dtask"))
    return subprocess.run(
        [dtask, *args], env={**_env(url), **env}, capture_output=True, text=True, timeout=120
    )


def test_migrate_beside_an_applications_own_alembic_history(empty_database: str) -> None:
    add_host_history(empty_database, HOST_REVISION)
    result = _dtask(empty_database, "migrate")
    assert result.returncode == 0, result.stderr
    assert_at_head_matching_models(empty_database)
    engine = create_engine(empty_database)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [
            (HOST_REVISION,)
        ]
        assert conn.execute(text("SELECT to_regclass('orders')")).scalar() is not None
    engine.dispose()


def test_a_database_migrated_into_alembic_version_is_adopted(empty_database: str) -> None:
    """Before 0.2 dtask kept its revision in Alembic's default table."""
    engine = create_engine(empty_database)
    schema.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {schema.VERSION_TABLE}"))
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)"))
        conn.execute(text("INSERT INTO alembic_version VALUES (:v)"), {"v": schema.HEAD})
    assert schema.current_revision(engine) == schema.HEAD
    schema.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regclass('alembic_version')")).scalar() is None
    engine.dispose()
    assert_at_head_matching_models(empty_database)


def test_a_shared_database_behind_is_refused_in_one_line_until_migrated(
    empty_database: str,
) -> None:
    refused = _dtask(empty_database, "runs")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "has no dtask schema: run `dtask migrate`" in refused.stderr
    assert "Traceback" not in refused.stderr
    engine = create_engine(empty_database)
    with engine.connect() as conn:  # nothing was created by the refused command
        assert conn.execute(text("SELECT to_regclass('dtask_runs')")).scalar() is None
    auto = _dtask(empty_database, "runs", DTASK_AUTO_MIGRATE="1")
    assert auto.returncode == 0, auto.stderr
    assert_at_head_matching_models(empty_database)
    for revision, says in [
        ("0014", f"has dtask schema 0014, this dtask needs {schema.HEAD}: run `dtask migrate`"),
        ("9999", "has dtask schema 9999, newer than this dtask knows"),
    ]:
        with engine.begin() as conn:
            conn.execute(
                text(f"UPDATE {schema.VERSION_TABLE} SET version_num = :v"), {"v": revision}
            )
        result = _dtask(empty_database, "runs")
        assert result.returncode == 2 and says in result.stderr, result.stderr
    engine.dispose()
