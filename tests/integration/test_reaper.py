"""One reaper pass against a real PostgreSQL and Redis: no single run, lock or stale row may
stop it from handling the others."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Claim, Store
from dtask.db.database import RUN_LOCKS
from dtask.domain.runs import NewRun, RunState
from dtask.worker import configure
from dtask.worker.reaper import LostMessages, Pass, reap_once
from dtask.worker.tasks import run_master
from tests.support.db import child_row, children, wait_for


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    configure()  # the templates and the Celery app, as in a worker
    yield services.store()


def lead_a_pass() -> Pass:
    """A pass as the reaper (another process's reaper may hold the turn for a moment)."""
    LostMessages.last = float("-inf")  # each pass of a test looks for lost messages
    done: list[Pass] = []
    wait_for(lambda: done.append(p) or True if (p := reap_once()).leader else False, 30, "turn")
    return done[0]


def sql(statement: str, **params: object) -> None:
    with services.store().engine.begin() as conn:
        conn.execute(text(statement), params)


def new_run(store: Store, template: str, variables: dict[str, int]) -> int:
    run_id, _ = store.runs.create(NewRun(template, f"test:{uuid.uuid4()}", variables, 3, None))
    return run_id


def master_sent_at(run_id: int) -> object:
    with services.store().engine.connect() as conn:
        return conn.execute(
            text("SELECT master_sent_at FROM dtask_runs WHERE id = :r"), {"r": run_id}
        ).scalar_one()


def running_run(store: Store, children: int = 1) -> int:
    run_id = new_run(store, "print_range", {"n": children})
    store.runs.split(run_id, lambda run, slots: [{"a": i, "b": i} for i in range(children)])
    store.runs.dispatch(run_id, lambda run, todo: None)
    return run_id


def expire_lease_of_child_0(store: Store, run_id: int) -> None:
    assert isinstance(store.children.claim(run_id, 0, "gone:1", 30), Claim)
    sql(
        "UPDATE dtask_children SET lease_expires_at = now() - interval '1 s' WHERE run_id = :r",
        r=run_id,
    )


def test_stuck_runs_get_their_master_re_sent_and_a_bad_split_fails_only_its_run(
    store: Store,
) -> None:
    bad = new_run(store, "broken_split", {"n": 3})
    good = new_run(store, "print_range", {"n": 10})
    sql(
        "UPDATE dtask_runs SET updated_at = now() - interval '1 hour' WHERE id IN (:b, :g)",
        b=bad,
        g=good,
    )  # both stuck in pending: their masters' messages were lost
    # the pass runs no split: it re-sends both masters (a pass takes 100 stuck runs, oldest
    # first: earlier tests' leftovers may come before these)
    wait_for(
        lambda: lead_a_pass() and None not in (master_sent_at(bad), master_sent_at(good)),
        60, "both masters re-sent",
    )  # fmt: skip
    first = {run_id: master_sent_at(run_id) for run_id in (bad, good)}
    lead_a_pass()
    assert {run_id: master_sent_at(run_id) for run_id in (bad, good)} == first  # once per stall
    for run_id in (bad, good):  # what the master task does on the worker that takes it
        run_master(store, run_id)
    failed = store.runs.status(bad)
    assert failed.state is RunState.FAILED
    assert "KeyError" in (failed.error or "") and "broken_split" in (failed.error or "")
    assert store.runs.status(good).state is RunState.RUNNING


def test_a_held_run_lock_does_not_hold_up_the_pass(store: Store) -> None:
    done = running_run(store)
    claim = store.children.claim(done, 0, "me:1", 30)
    assert isinstance(claim, Claim)
    store.children.finish(claim, None)
    sql(
        "UPDATE dtask_children SET finished_at = now() - interval '1 min' WHERE run_id = :r", r=done
    )
    other = running_run(store)
    expire_lease_of_child_0(store, other)
    with services.store().engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:ns, :r)"), {"ns": RUN_LOCKS, "r": done})
        try:
            passing = threading.Thread(target=lead_a_pass, daemon=True)
            passing.start()
            passing.join(timeout=20)
            assert not passing.is_alive(), "the pass waited on a run's lock"
            assert child_row(other, 0).state == "pending"  # the expired lease was released
            assert store.runs.status(done).state is RunState.RUNNING  # left for later
        finally:
            holder.execute(text("SELECT pg_advisory_unlock_all()"))
            holder.commit()
    lead_a_pass()
    assert store.runs.status(done).state is RunState.SUCCEEDED


def test_stale_rows_of_cancelled_runs_do_not_block_failover(store: Store) -> None:
    cancelled = running_run(store, children=1001)
    sql(
        "UPDATE dtask_children SET state = 'running', owner = 'gone:1', attempt = 1,"
        " fence = 1, lease_expires_at = now() - interval '1 hour' WHERE run_id = :r",
        r=cancelled,
    )  # a worker died while these ran, then the run was cancelled
    store.runs.cancel(cancelled)
    other = running_run(store)
    expire_lease_of_child_0(store, other)
    lead_a_pass()
    assert child_row(other, 0).state == "pending"
    lead_a_pass()
    assert {state for _, state, _ in children(cancelled)} == {"pending"}
