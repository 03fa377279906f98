"""docker-compose.yml's PostgreSQL roles, run for real on the session's PostgreSQL: the
owner migrates; the role every worker uses runs dtask (a run, its children, a claim) but
cannot change the schema."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import ProgrammingError

from dtask import services
from dtask.db import Database, schema
from dtask.db.runs import RunStore
from dtask.domain.runs import NewRun, RunState
from tests.support.db import new_database

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "postgres-roles.sh"


def role_sql(db: str, suffix: str) -> str:
    """The script's SQL with its psql variables filled in (and role names made unique)."""
    body = re.search(r"<<'SQL'\n(.*?)\nSQL\n", SCRIPT.read_text(), re.S)
    assert body is not None
    statements = [line for line in body.group(1).splitlines() if not line.startswith("\\")]
    sql = "\n".join(statements).replace(":'owner'", "'o-pw'").replace(":'app'", "'a-pw'")
    sql = sql.replace(':"db"', f'"{db}"')
    return sql.replace("dtask_owner", f"dtask_owner_{suffix}").replace(
        "dtask_app", f"dtask_app_{suffix}"
    )


def as_role(url: str, role: str) -> str:
    return url.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://{role}@", 1)


def test_the_app_role_runs_dtask_but_cannot_change_the_schema(dtask_env: dict[str, str]) -> None:
    suffix = uuid.uuid4().hex[:6]
    try:
        with new_database("roles") as url:
            db = url.split("?")[0].rsplit("/", 1)[1]
            run_as_superuser(url, role_sql(db, suffix).split(";"))
            owner = create_engine(as_role(url, f"dtask_owner_{suffix}"))
            app = create_engine(as_role(url, f"dtask_app_{suffix}"))
            try:
                schema.upgrade(owner)
                runs = RunStore(Database(app))
                run_id, created = runs.create(NewRun("t", "k", {}, 2, None))
                assert created
                split = runs.split(run_id, lambda run, slots: [{"i": 0}, {"i": 1}])
                assert split is RunState.SPLITTING
                assert runs.status(run_id).children.total == 2
                for ddl in (
                    "CREATE TABLE intruder (x int)",
                    "ALTER TABLE dtask_runs ADD COLUMN x int",
                    "DROP TABLE dtask_children",
                ):
                    with app.connect() as conn, pytest.raises(ProgrammingError, match=DENIED):
                        conn.execute(text(ddl))
            finally:
                owner.dispose()
                app.dispose()
    finally:
        run_as_superuser(
            services.database_url(),
            [
                f"DROP ROLE IF EXISTS dtask_app_{suffix}",
                f"DROP ROLE IF EXISTS dtask_owner_{suffix}",
            ],
        )


def run_as_superuser(url: str, statements: list[str]) -> None:
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            for statement in statements:
                if statement.strip():
                    conn.execute(text(statement))
    finally:
        engine.dispose()


DENIED = r"permission denied|must be owner"
