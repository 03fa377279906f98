"""`dtask prune` on a big old run while workers keep working: the old rows go in small
transactions, the live run beside it is not held up, and the rate is printed (docs)."""

from __future__ import annotations

import json
import time
import uuid

import pytest

import dtask
from dtask import services
from dtask.db.database import sql
from dtask.domain.runs import NewRun
from tests.acceptance.test_core import cli
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance
ROWS = 100_000


def old_run(children: int, days_ago: int) -> int:
    """A run of ``children`` succeeded children that finished ``days_ago`` days ago."""
    store = services.store()
    run_id, _ = store.runs.create(NewRun("print_range", f"old:{uuid.uuid4()}", {"n": 1}, 1, None))
    with store.db.tx() as conn:
        conn.execute(
            sql(
                "INSERT INTO dtask_children (run_id, index, spec, max_attempts, state, attempt,"
                " finished_at) SELECT :id, g, jsonb_build_object('a', g, 'b', g), 1,"
                " 'succeeded', 1, now() FROM generate_series(0, :n - 1) g"
            ),
            {"id": run_id, "n": children},
        )
        conn.execute(
            sql(
                "UPDATE dtask_runs SET state = 'succeeded', child_total = :n, chord_size = :n,"
                " finished_at = now() - make_interval(days => :d) WHERE id = :id"
            ),
            {"id": run_id, "n": children, "d": days_ago},
        )
    return run_id


def test_prune_deletes_a_big_old_run_in_chunks_while_a_run_goes_on(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    old = old_run(ROWS, days_ago=10)  # inside the workers' own 30 days: only this prune acts
    dry = cli(dtask_env, "prune", "--older-than", "5", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["children"] >= ROWS
    live = dtask.submit("slow_range", {"n": 200, "delay": 0.02})
    started = time.monotonic()
    pruned = cli(dtask_env, "prune", "--older-than", "5", "--json")
    elapsed = time.monotonic() - started
    assert pruned.returncode == 0, pruned.stderr
    done = json.loads(pruned.stdout)
    assert done["runs"] >= 1 and done["children"] >= ROWS
    assert live.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    with pytest.raises(dtask.RunNotFound):
        dtask.get_run(old)
    print(f"\npruned {done['children']:,} child rows in {elapsed:.1f} s"
          f" ({done['children'] / elapsed:,.0f} rows/s) beside a running run")  # fmt: skip
    refused = cli(dtask_env, "prune", "--older-than", "-1")
    assert refused.returncode == 2 and "is not a number of days" in refused.stderr
