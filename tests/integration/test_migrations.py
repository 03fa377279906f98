"""`alembic upgrade head` on an empty database creates exactly what the models describe."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, text

from dtask import services
from dtask.db import schema
from dtask.db.models import Base
from tests.conftest import REPO


@pytest.fixture
def empty_database(dtask_env: dict[str, str]) -> Iterator[str]:
    admin = create_engine(services.database_url(), isolation_level="AUTOCOMMIT")
    name = f"migration_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = services.database_url().replace("/postgres?", f"/{name}?")
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def assert_at_head_matching_models(url: str) -> None:
    engine = create_engine(url)
    try:
        assert schema.current_revision(engine) == schema.HEAD
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
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
