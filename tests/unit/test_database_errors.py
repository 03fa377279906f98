"""Which PostgreSQL errors mean dtask's schema is missing or behind: by SQLSTATE, not by the
words "does not exist" (PgBouncer's `prepared statement "_pg3_0" does not exist` once read as
"dtask's tables are missing ... run dtask migrate")."""

from __future__ import annotations

import psycopg.errors
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from dtask.db import Database, schema
from dtask.db.engine import unreachable
from dtask.exceptions import DatabaseUnavailable, SchemaMismatch
from dtask.settings import shown_url


def raised(error: Exception) -> Exception:
    db = Database(create_engine("postgresql+psycopg://dtask@db.invalid/dtask"))
    with pytest.raises(Exception) as caught, db._errors():
        raise ProgrammingError("SELECT 1", {}, error)
    return caught.value


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.UndefinedTable('relation "dtask_runs" does not exist'),
        psycopg.errors.UndefinedColumn('column "client" does not exist'),
    ],
)
def test_a_missing_table_or_column_says_run_dtask_migrate(error: Exception) -> None:
    got = raised(error)
    assert isinstance(got, DatabaseUnavailable)
    assert "dtask's tables are missing" in str(got) and "run `dtask migrate`" in str(got)


def test_a_pooler_s_lost_prepared_statement_is_not_taken_for_a_missing_table() -> None:
    got = raised(
        psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist')
    )
    assert isinstance(got, ProgrammingError) and "migrate" not in str(got)


SECRET_QUERY = "postgresql+psycopg://u:pw@/db?host=/run/pg&password=S3CRET&sslpassword=K3Y"


def test_shown_url_masks_a_password_given_in_the_query() -> None:
    shown = shown_url(make_url(SECRET_QUERY))
    assert "S3CRET" not in shown and "K3Y" not in shown and "pw" not in shown
    assert "password=***" in shown and "sslpassword=***" in shown and "/db" in shown


@pytest.mark.parametrize(
    "error",
    [psycopg.OperationalError("connection refused"), psycopg.errors.DiskFull("disk full")],
)
def test_cannot_reach_postgresql_never_shows_a_password_in_the_query(error: Exception) -> None:
    said = str(unreachable(OperationalError("SELECT 1", {}, error), create_engine(SECRET_QUERY)))
    assert "PostgreSQL at postgresql+psycopg://u:***@/db?" in said
    assert "S3CRET" not in said and "K3Y" not in said


def test_a_schema_mismatch_never_shows_a_password_in_the_query() -> None:
    with pytest.raises(SchemaMismatch) as refused:
        schema.refuse_newer(create_engine(SECRET_QUERY), "9999")
    assert "S3CRET" not in str(refused.value) and "password=***" in str(refused.value)
