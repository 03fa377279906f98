"""Procrastinate as its users run it, on the benchmark's embedded PostgreSQL (a database of its
own, ``procrastinate_bench``, with Procrastinate's schema): a no-op task. Procrastinate has no
broker and no fan-in (no group, chord or completion callback): its client defers N jobs and
watches its jobs table (bench.procrastinate_client).

    procrastinate --app bench.procrastinate_app.app --log-level warning worker --concurrency 1

DTASK_BENCH_PROCRASTINATE_DSN is that database's libpq URL (bench.peers sets it).
"""

from __future__ import annotations

import os

import procrastinate
import psycopg

DATABASE = "procrastinate_bench"

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("DTASK_BENCH_PROCRASTINATE_DSN", "")
    )
)


@app.task(name="child")
def child(a: int, b: int) -> None:
    return None


def create_database(dsn: str) -> str:
    """Make ``procrastinate_bench`` beside the database ``dsn`` names (the embedded server's,
    a fresh one each time), apply Procrastinate's schema in it, and return its URL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
        own = psycopg.conninfo.make_conninfo(dsn, dbname=DATABASE)
    with psycopg.connect(own, autocommit=True) as conn:
        conn.execute(app.schema_manager.get_schema())  # what `procrastinate schema --apply` runs
    return own
