"""dtask wholly behind a real PgBouncer in transaction mode (Debian's 1.18, as a Django shop
runs it), with fewer server connections than its clients: migrate, submit a run of 1,000
children, SIGKILL a worker mid-run, a schedule fired by the beat, `dtask status`. Nothing but
the test's own checks talks to PostgreSQL directly."""

from __future__ import annotations

import itertools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from dtask import services
from soak.cluster import FAST
from tests.conftest import DTASK, REPO, BeatProcess, WorkerProcess
from tests.support.db import wait_for
from tests.support.pgbouncer import pgbouncer

pytestmark = pytest.mark.acceptance


@pytest.fixture
def pooled_env(dtask_env: dict[str, str]) -> Iterator[dict[str, str]]:
    resolved = services.ensure_broker()  # the embedded PostgreSQL and Redis, named explicitly
    with pgbouncer(resolved.database_url, server_connections=8) as url:
        yield {
            **dtask_env,
            **FAST,
            "DTASK_DATABASE_URL": url,
            "DTASK_BROKER_URL": resolved.broker_url,
            "DTASK_RESULT_BACKEND": resolved.result_backend,
        }


def dtask(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def scalar(query: str, **params: object) -> int:
    with services.store().db.tx() as conn:
        return int(conn.execute(text(query), params).scalar() or 0)


def test_a_run_a_worker_killed_and_a_schedule_all_through_pgbouncer_in_transaction_mode(
    pooled_env: dict[str, str], tmp_path: Path
) -> None:
    migrated = dtask(pooled_env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    workers = [WorkerProcess(pooled_env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    beat = BeatProcess(pooled_env, tmp_path / "beat.log")
    try:
        for worker in workers:
            worker.wait_ready(timeout=120)
        beat.wait_ready(timeout=120)
        submitted = dtask(
            pooled_env, "submit", "slow_range", "-e", "n=20000", "-e", "delay=0.0005", "--json"
        )
        assert submitted.returncode == 0, submitted.stderr
        run_id = int(json.loads(submitted.stdout)["id"])
        schedule = f"pooled-{run_id}"
        added = dtask(pooled_env, "schedule", "add", schedule, "print_range", "-e", "n=3",
                      "--every", "2")  # fmt: skip
        assert added.returncode == 0, added.stderr

        finished = "SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'succeeded'"
        wait_for(lambda: scalar(finished, r=run_id) >= 100, timeout=180, what="100 children")
        workers[0].kill()  # mid-run: its children's leases expire and others take them over

        ended = "SELECT count(*) FROM dtask_runs WHERE id = :r AND finished_at IS NOT NULL"
        wait_for(lambda: scalar(ended, r=run_id), timeout=300, what="the run's end")
        shown = dtask(pooled_env, "status", str(run_id), "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "succeeded", shown.stdout[-2000:]
        assert scalar(finished, r=run_id) == 1000
        assert scalar("SELECT count(*) FROM dtask_children WHERE run_id = :r", r=run_id) == 1000
        fired = "SELECT count(*) FROM dtask_runs WHERE trigger_key LIKE :k AND state = 'succeeded'"
        wait_for(lambda: scalar(fired, k=f"schedule:{schedule}:%") >= 1, timeout=120,
                 what="a slot of the schedule")  # fmt: skip
        removed = dtask(pooled_env, "schedule", "rm", schedule)
        assert removed.returncode == 0, removed.stderr
    finally:
        beat.stop()
        for worker in workers:
            worker.stop()
    logs = "".join(p.output() for p in [*workers, beat])
    assert "connecting as through a transaction pooler" in workers[1].output()
    for unwanted in ("prepared statement", "unsupported startup parameter", "Traceback"):
        assert unwanted not in logs, unwanted


def test_a_worker_past_pgbouncer_s_client_limit_refuses_to_start_and_one_within_starts(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    resolved = services.ensure_broker()
    with pgbouncer(resolved.database_url, clients=12, admin="postgres") as url:
        env = {
            **dtask_env,
            "DTASK_DATABASE_URL": url,
            "DTASK_BROKER_URL": resolved.broker_url,
            "DTASK_RESULT_BACKEND": resolved.result_backend,
        }
        refused = subprocess.run(
            [DTASK, "worker", "-c", "16"], env=env, capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        line = refused.stderr.strip().splitlines()[-1]  # after the pooler's one line
        assert line.startswith(
            "dtask worker: a worker of concurrency 16 (prefork pool) may hold 18 PostgreSQL"
            " connections; with the "
        ), line
        assert line.endswith("over the 12 PgBouncer's max_client_conn allows: lower --concurrency"
                             " or DTASK_DB_POOL, or raise max_client_conn"), line  # fmt: skip
        within = WorkerProcess(env, tmp_path / "w.log", "-c", "2")
        try:
            within.wait_ready(timeout=120)
        finally:
            within.stop()
        assert "client limit" not in within.output()


def test_a_concurrency_key_holds_behind_pgbouncer(
    pooled_env: dict[str, str], tmp_path: Path
) -> None:
    """Its admission's advisory locks are transaction-scoped: a transaction pooler keeps them."""
    migrated = dtask(pooled_env, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    workers = [WorkerProcess(pooled_env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    try:
        for worker in workers:
            worker.wait_ready(timeout=120)
        key = f"pooled-{tmp_path.name}"
        hold = Path(pooled_env["DTASK_TEST_SINK"]) / key
        hold.touch()  # the first run holds its key until the other five are seen waiting
        ids = []
        for _ in range(6):
            made = dtask(pooled_env, "submit", "per_customer", "-e", "customer=x", "-e", "n=40",
                         "-e", f"hold={hold.name}", "--concurrency-key", key, "-q")  # fmt: skip
            assert made.returncode == 0, made.stderr
            ids.append(int(made.stdout.split()[0]))
        states = "SELECT count(*) FROM dtask_runs WHERE id = ANY(:ids) AND state = :s"
        wait_for(lambda: scalar(states, ids=ids, s="running") == 1, 60, "the first run to run")
        assert scalar(states, ids=ids, s="waiting") == 5
        hold.unlink()
        ended = "SELECT count(*) FROM dtask_runs WHERE id = ANY(:ids) AND state = 'succeeded'"
        wait_for(lambda: scalar(ended, ids=ids) == 6, timeout=180, what="the six runs")
    finally:
        for worker in workers:
            worker.stop()
    with services.store().db.tx() as conn:
        spans = conn.execute(
            text(
                "SELECT min(started_at) AS a, max(finished_at) AS b FROM dtask_children"
                " WHERE run_id = ANY(:ids) GROUP BY run_id ORDER BY a"
            ),
            {"ids": ids},
        ).all()
    assert len(spans) == 6
    assert all(one.b <= two.a for one, two in itertools.pairwise(spans))  # one at a time
    assert "Traceback" not in "".join(w.output() for w in workers)
