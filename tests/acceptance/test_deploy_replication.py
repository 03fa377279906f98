"""deploy/compose.replicated.yml's PostgreSQL scripts, run for real (no Docker engine here) with
the bundled PostgreSQL: the primary's first start (deploy/postgres-roles.sh and
deploy/postgres-replication.sh, as its image's entrypoint runs them), then the standby's
entrypoint (deploy/postgres-standby.sh), which clones the primary with the replication
password and streams from it. dtask's owner then migrates through the URL
deploy/make-secrets.sh writes: both hosts, the standby named first, and libpq picks the
primary."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text

from dtask.db import schema
from tests.support.db import wait_for
from tests.support.ports import free_port
from tests.support.replicas import _bin, _user, own_folder, run

pytestmark = pytest.mark.acceptance

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORDS = {"dtask_owner_password": "o-pw", "dtask_app_password": "a-pw"}


def script_env(**values: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{_bin()}:{os.environ['PATH']}", **values}


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    found = tmp_path / "pg"
    own_folder(found)
    yield found
    for data in ("primary", "standby"):
        if (found / data / "postmaster.pid").exists():
            subprocess.run(
                [str(_bin() / "pg_ctl"), "-D", str(found / data), "-m", "immediate", "stop"],
                user=_user(), capture_output=True, check=False, timeout=60,
            )  # fmt: skip


def test_the_standby_clones_the_primary_and_dtask_finds_the_primary_among_both(
    folder: Path,
) -> None:
    user = _user()
    secrets = folder / "secrets"
    secrets.mkdir()
    for name, value in {**PASSWORDS, "replication_password": "r-pw"}.items():
        (secrets / name).write_text(value)
    primary, standby = folder / "primary", folder / "standby"
    port, standby_port = free_port(), free_port()
    run([
        str(_bin() / "initdb"), "-D", str(primary), "-U", "postgres",
        "--auth-local=trust", "--auth-host=scram-sha-256",
    ])  # fmt: skip
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    run([str(_bin() / "pg_ctl"), "-D", str(primary), "-o", options, "-w",
         "-l", str(folder / "primary.log"), "start"])  # fmt: skip
    run([str(_bin() / "createdb"), "-h", str(folder), "-p", str(port), "-U", "postgres", "dtask"])
    entry = script_env(
        POSTGRES_USER="postgres", POSTGRES_DB="dtask", PGDATA=str(primary),
        PGHOST=str(folder), PGPORT=str(port), DTASK_SECRETS_DIR=str(secrets),
    )  # fmt: skip
    for script in ("postgres-roles.sh", "postgres-replication.sh"):
        done = subprocess.run(["sh", str(DEPLOY / script)], env=entry, user=user,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, f"{script}: {done.stderr}"
    run([str(_bin() / "pg_ctl"), "-D", str(primary), "reload"])

    log = (folder / "standby.log").open("wb")
    server = subprocess.Popen(
        ["sh", str(DEPLOY / "postgres-standby.sh")],
        env=script_env(
            PGDATA=str(standby), PGPORT=str(standby_port), DTASK_PRIMARY_HOST="127.0.0.1",
            DTASK_PRIMARY_PORT=str(port), DTASK_SECRETS_DIR=str(secrets),
        ),
        user=user, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    app_at = "host=127.0.0.1 user=dtask_app password=a-pw dbname=dtask connect_timeout=2 port="
    try:
        wait_for(lambda: _answers(app_at + str(standby_port)), 120, "the standby to answer")
        with psycopg.connect(app_at + str(standby_port)) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        wait_for(lambda: _streams_to(folder, port) == [("replicator",)], 60, "WAL to stream")

        url = (
            "postgresql+psycopg://dtask_owner:o-pw@/dtask"
            f"?host=127.0.0.1:{standby_port}&host=127.0.0.1:{port}"
            "&target_session_attrs=read-write"
        )  # the standby first, as after a failover and back
        owner = create_engine(url)
        try:
            schema.upgrade(owner)
        finally:
            owner.dispose()
        wait_for(lambda: _has_dtask_tables(app_at + str(standby_port)), 60, "tables replayed")
        app = create_engine(url.replace("dtask_owner:o-pw", "dtask_app:a-pw"))
        try:
            with app.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM dtask_runs")).scalar() == 0
        finally:
            app.dispose()
    finally:
        server.terminate()
        server.wait(60)


def _streams_to(folder: Path, port: int) -> list[tuple[str]]:
    with psycopg.connect(f"host={folder} port={port} user=postgres dbname=dtask") as conn:
        return [(str(r[0]),) for r in conn.execute("SELECT usename FROM pg_stat_replication")]


def _answers(conninfo: str) -> bool:
    try:
        with psycopg.connect(conninfo) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _has_dtask_tables(conninfo: str) -> bool:
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT to_regclass('dtask_runs') IS NOT NULL").fetchone()
    return bool(row and row[0])
