"""The PostgreSQL connection budget on a stock server (max_connections 100, as the embedded
one): what busy workers really hold stays within what the budget counts for them (a pool
process 1, a prefork main process 2: C + 2 a worker), three `-c 8` workers start beside each
other, rows of workers that are gone refuse nobody, and a worker that cannot fit refuses to
start in one line."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

import dtask
from dtask import services
from dtask.db.database import sql
from dtask.domain.limits import (
    MAIN_PROCESS_CONNECTIONS,
    POOL_PROCESS_CONNECTIONS,
    worker_connections,
)
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


@contextmanager
def most_held(pids: list[int]) -> Iterator[dict[int, int]]:
    """The most connections each of ``pids`` held at once while the block ran."""
    most: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid, n in held_by(pids).items():
                most[pid] = max(most.get(pid, 0), n)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield most
    finally:
        stop.set()
        sampler.join()


def test_three_busy_c8_workers_fit_a_stock_postgresql_and_hold_what_the_budget_counts(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    workers = [WorkerProcess(dtask_env, tmp_path / f"w{i}.log", "-c", "8") for i in range(3)]
    try:
        for worker in workers:
            worker.wait_ready(timeout=180)
        mains = [psutil.Process(w.proc.pid) for w in workers]
        pools = [[p.pid for p in main.children(recursive=True)] for main in mains]
        assert [len(pool) for pool in pools] == [8, 8, 8], pools
        everyone = [
            pid for main, pool in zip(mains, pools, strict=True) for pid in [main.pid, *pool]
        ]
        with most_held(everyone) as most:
            run = dtask.submit("slow_range", {"n": 3000, "delay": 0.002})
            assert run.wait(timeout=300).state is dtask.RunState.SUCCEEDED
        per_process = services.current().settings.db_pool
        for main, pool in zip(mains, pools, strict=True):
            assert 0 < most.get(main.pid, 0) <= MAIN_PROCESS_CONNECTIONS, most
            assert all(most.get(pid, 0) <= POOL_PROCESS_CONNECTIONS for pid in pool), most
            held = sum(most.get(pid, 0) for pid in [main.pid, *pool])
            assert held <= worker_connections(8, per_process) == 8 + 2
        assert sum(most.get(pid, 0) > 0 for pool in pools for pid in pool) >= 8  # work spread
        print(
            "\nmost connections held per worker (main + pool processes):",
            [
                f"{most[main.pid]} + {sum(most.get(pid, 0) for pid in pool)}"
                for main, pool in zip(mains, pools, strict=True)
            ],
        )
    finally:
        for worker in workers:
            worker.stop()


def test_rows_of_workers_that_are_gone_refuse_no_worker(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """Workers SIGKILLed a moment ago still have fresh rows (64 slots each here) but hold no
    connection: the new worker starts, and says the live ones could run short at their
    busiest."""
    gone = [f"gone-{uuid.uuid4().hex[:8]}@host{i}" for i in range(6)]
    with services.store().db.tx() as conn:
        for name in gone:
            conn.execute(
                sql(
                    "INSERT INTO dtask_workers (name, queues, slots, pid, busy, templates)"
                    " VALUES (:name, ARRAY['dtask'], 64, 1, 0, NULL)"
                ),
                {"name": name},
            )
    worker = WorkerProcess(dtask_env, tmp_path / "w.log", "-c", "2")
    try:
        worker.wait_ready()
        assert "PostgreSQL connections at their busiest" in worker.output()
    finally:
        worker.stop()
        with services.store().db.tx() as conn:
            conn.execute(sql("DELETE FROM dtask_workers WHERE name = ANY(:n)"), {"n": gone})


def test_a_worker_that_cannot_fit_beside_the_connections_in_use_refuses_to_start(
    dtask_env: dict[str, str],
) -> None:
    refused = subprocess.run(
        [DTASK, "worker", "-c", "200"],  # refused before its pool starts
        env=dtask_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith(
        "dtask worker: a worker of concurrency 200 (prefork pool) may hold 202"
        " PostgreSQL connections; with the "
    ), line
    assert "lower --concurrency or DTASK_DB_POOL, or put PgBouncer" in line
