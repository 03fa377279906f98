"""Retention against a real PostgreSQL: only finished runs older than the limit go, with their
children, in chunks; a dry run counts the same; a rerun never resumes a half-pruned run."""

from __future__ import annotations

import uuid

import pytest

from dtask import services
from dtask.db import Store
from dtask.db.database import sql
from dtask.domain.runs import NewRun, RunState
from dtask.exceptions import NothingToRerun

DAY = 86400.0


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def finished_run(store: Store, children: int, days_ago: float, ok: bool = True) -> int:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    store.runs.split(run_id, lambda run, slots: [{"i": i} for i in range(children)])
    store.runs.dispatch(run_id, lambda run, kids: None)
    with store.db.tx() as conn:  # every child done at once, as a worker would leave them
        conn.execute(
            sql(
                "UPDATE dtask_children SET state = CAST(:state AS text), finished_at = now(),"
                " error = CASE WHEN CAST(:state AS text) = 'failed' THEN 'boom' END"
                " WHERE run_id = :id"
            ),
            {"id": run_id, "state": "succeeded" if ok else "failed"},
        )
    store.runs.finalize(run_id)
    with store.db.tx() as conn:
        conn.execute(
            sql(
                "UPDATE dtask_runs SET finished_at = now() - make_interval(days => :d)"
                " WHERE id = :id"
            ),
            {"id": run_id, "d": days_ago},
        )
    return run_id


def logged(store: Store, run_id: int, attempts: int) -> int:
    """``attempts`` logged attempts of each child of the run (as failed ones leave), counted."""
    with store.db.tx() as conn:
        conn.execute(
            sql(
                "INSERT INTO dtask_child_logs (run_id, index, attempt, worker, state, output)"
                " SELECT run_id, index, a, 'host:1', 'failed', 'out' FROM dtask_children,"
                " generate_series(1, :n) a WHERE run_id = :id"
            ),
            {"id": run_id, "n": attempts},
        )
        return int(
            conn.execute(
                sql("SELECT count(*) FROM dtask_child_logs WHERE run_id = :id"), {"id": run_id}
            ).scalar_one()
        )


def exists(store: Store, run_id: int) -> tuple[bool, int]:
    with store.db.tx() as conn:
        row = conn.execute(
            sql(
                "SELECT EXISTS (SELECT 1 FROM dtask_runs WHERE id = :id) AS run,"
                " (SELECT count(*) FROM dtask_children WHERE run_id = :id) AS children"
            ),
            {"id": run_id},
        ).one()
    return bool(row.run), int(row.children)


def test_only_finished_runs_past_the_limit_go_with_their_children(store: Store) -> None:
    store.retention.prune(1000 * DAY)  # what older tests left past the horizon is not ours
    old = [finished_run(store, 1200, 40), finished_run(store, 3, 31, ok=False)]
    young = finished_run(store, 3, 10)
    running, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    after, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None, after=[old[0]]))
    assert store.retention.count(30 * DAY).runs >= 2
    assert logged(store, old[0], 2) == 2400 and logged(store, young, 1) == 3
    counted = store.retention.count(30 * DAY)
    pruned = store.retention.prune(30 * DAY, children_per_chunk=500)
    assert pruned == counted and pruned.children >= 1203
    assert [exists(store, r) for r in old] == [(False, 0), (False, 0)]
    assert logged(store, old[0], 0) == 0 and logged(store, young, 0) == 3  # pruned with them
    assert exists(store, young) == (True, 3) and exists(store, running)[0]
    assert store.runs.status(after).after == ()  # its finished upstream is gone, not the run
    assert store.retention.prune(30 * DAY).runs == 0


def test_a_run_whose_prune_was_cut_short_is_not_rerun(store: Store) -> None:
    run_id = finished_run(store, 10, 40, ok=False)
    stop_after_first_chunk = iter([True, True, False])
    store.retention.prune(
        30 * DAY, keep_going=lambda: next(stop_after_first_chunk, False), children_per_chunk=4
    )
    assert exists(store, run_id) == (True, 6)
    with pytest.raises(NothingToRerun, match=f"run {run_id} is being pruned"):
        store.runs.rerun(run_id)
    assert store.runs.status(run_id).state is RunState.FAILED


def test_a_run_rerun_before_its_prune_is_left_alone(store: Store) -> None:
    run_id = finished_run(store, 5, 40, ok=False)
    assert store.runs.rerun(run_id) is RunState.SPLITTING
    store.retention.prune(30 * DAY)
    assert exists(store, run_id) == (True, 5)
