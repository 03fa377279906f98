"""A pool process killed mid-child: the child resumes from its checkpoint elsewhere."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance


def child_row(run_id: int, index: int) -> tuple[str | None, str, int, object]:
    """(owner, state, attempt, checkpoint); state "absent" before the master has split."""
    with services.store().engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT owner, state, attempt, checkpoint FROM dtask_children"
                " WHERE run_id = :r AND index = :i"
            ),
            {"r": run_id, "i": index},
        ).first()
    if row is None:
        return None, "absent", 0, None
    return row.owner, row.state, row.attempt, row.checkpoint


def test_killing_the_pool_process_resumes_the_child_from_its_checkpoint(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.submit("slow_range", {"n": 40, "delay": 0.1})
    deadline = time.monotonic() + 30
    while True:
        owner, state, _, checkpoint = child_row(run.id, 0)
        if state == "running" and isinstance(checkpoint, dict) and checkpoint["done"] >= 10:
            break
        assert time.monotonic() < deadline, "child 0 never got going"
        time.sleep(0.05)
    assert owner is not None
    killed_at = time.monotonic()
    os.kill(int(owner.rsplit(":", 1)[1]), signal.SIGKILL)

    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert time.monotonic() - killed_at < 30
    _, _, attempt, _ = child_row(run.id, 0)
    assert attempt == 2
    seen = [int(x) for x in (sink / f"{run.id}-0.txt").read_text().split()]
    assert set(seen) == set(range(1, 21))
    assert len(seen) - len(set(seen)) <= 5  # at most one checkpoint interval re-done
    assert all(w.proc.poll() is None for w in workers), "the workers themselves survive"
