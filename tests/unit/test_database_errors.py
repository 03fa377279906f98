"""Which PostgreSQL errors mean dtask's schema is missing or behind: by SQLSTATE, not by the
words "does not exist" (PgBouncer's `prepared statement "_pg3_0" does not exist` once read as
"dtask's tables are missing ... run dtask migrate")."""

from __future__ import annotations

import psycopg.errors
import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import ProgrammingError

from dtask.db import Database
from dtask.exceptions import DatabaseUnavailable


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
