"""What the tests of a worker cut off from PostgreSQL read (test_partitions.py,
test_blackholed_postgres.py): which processes are a worker's, how far its running children
are, and what each child's attempts printed, stamped."""

from __future__ import annotations

from pathlib import Path

import psutil
from sqlalchemy import text

from dtask import services
from tests.conftest import WorkerProcess
from tests.support.db import owner_pid


def pids_of(worker: WorkerProcess) -> set[int]:
    """The worker's main process and its pool processes."""
    try:
        main = psutil.Process(worker.proc.pid)
        return {main.pid} | {p.pid for p in main.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def progress(run_id: int) -> dict[int, tuple[int, int]]:
    """index -> (owner pid, items its checkpoint says are done) of the run's running children."""
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT index AS i, owner, checkpoint FROM dtask_children WHERE run_id = :r"
                " AND state = 'running' AND owner IS NOT NULL"
            ),
            {"r": run_id},
        ).all()
    return {int(r.i): (owner_pid(r.owner), (r.checkpoint or {}).get("done", 0)) for r in rows}


def stamped(sink: Path, run_id: int, index: int) -> list[tuple[int, int, float]]:
    """(item, pid, unix time) of every line the child's attempts printed."""
    text = (sink / f"{run_id}-{index}.txt").read_text()
    lines = [line.split() for line in text.splitlines() if line.strip()]
    return [(int(i), int(pid), float(ts)) for i, pid, ts in lines]
