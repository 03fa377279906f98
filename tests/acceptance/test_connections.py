"""The PostgreSQL connection budget: what a busy worker really holds stays within what the
budget counts for it, and a worker that could take the server past max_connections refuses
to start in one line."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

import dtask
from dtask import services
from dtask.db.database import sql
from dtask.domain.limits import ENGINES, POOL_PROCESS_CONNECTIONS, worker_connections
from tests.conftest import DTASK, WorkerProcess

pytestmark = pytest.mark.acceptance


def held_by(pids: list[int]) -> dict[int, int]:
    """Connections each of ``pids`` holds now, from pg_stat_activity's application names."""
    with services.store().db.tx() as conn:
        rows = conn.execute(
            sql(
                "SELECT application_name AS app, count(*) AS n FROM pg_stat_activity"
                " WHERE application_name = ANY(:apps) GROUP BY application_name"
            ),
            {"apps": [f"dtask:{pid}" for pid in pids]},
        ).all()
    return {int(r.app.split(":")[1]): int(r.n) for r in rows}


def test_a_busy_worker_holds_no_more_connections_than_its_budget(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    worker = WorkerProcess(dtask_env, tmp_path / "w.log", "-c", "2")
    try:
        worker.wait_ready()
        main = psutil.Process(worker.proc.pid)
        pool = [p.pid for p in main.children(recursive=True)]
        assert len(pool) == 2, pool
        most: dict[int, int] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for pid, n in held_by([main.pid, *pool]).items():
                    most[pid] = max(most.get(pid, 0), n)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            run = dtask.submit("slow_range", {"n": 2000, "delay": 0.001})
            assert run.wait(timeout=180).state is dtask.RunState.SUCCEEDED
        finally:
            stop.set()
            sampler.join()
        per_engine = services.current().settings.db_pool
        assert 0 < most.get(main.pid, 0) <= ENGINES * per_engine, most
        assert all(0 < most.get(pid, 0) <= ENGINES * POOL_PROCESS_CONNECTIONS for pid in pool)
        assert sum(most.values()) <= worker_connections(2, per_engine)
        print(f"\nmost connections held: main {most[main.pid]}, pool {[most[p] for p in pool]}")
    finally:
        worker.stop()


def test_a_worker_that_could_exhaust_max_connections_refuses_to_start(
    dtask_env: dict[str, str],
) -> None:
    refused = subprocess.run(
        [DTASK, "worker", "-c", "2"],
        env={**dtask_env, "DTASK_DB_POOL": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("dtask worker: a worker of concurrency 2 may hold 612 PostgreSQL")
    assert "lower --concurrency or DTASK_DB_POOL (200), or raise max_connections" in line
