"""A large split leaves dtask_children with statistics that describe it (dtask.db.statistics):
without them the run's claims and releases were planned for the table as autovacuum last saw
it, and read every pending child of the run per message."""

from __future__ import annotations

import uuid

import pytest

from dtask import services
from dtask.db import Store, statistics
from dtask.db.database import sql
from dtask.db.statistics import LARGE_SPLIT, SHARE
from dtask.domain.runs import NewRun, RunState
from dtask.worker import configure, dispatcher
from dtask.worker.tasks import run_master
from tests.support.db import wait_for


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def analyzed(store: Store) -> int:
    with store.db.tx() as conn:
        return int(
            conn.execute(
                sql(
                    "SELECT analyze_count FROM pg_stat_user_tables"  # ours, not autovacuum's
                    " WHERE relid = 'dtask_children'::regclass"
                )
            ).scalar_one()
        )


def split(store: Store, children: int) -> None:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    plan = [{"i": i} for i in range(children)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    store.runs.refresh_statistics(children)  # what a master does once its first message left


def test_a_large_split_refreshes_the_statistics_of_dtask_children(store: Store) -> None:
    with store.db.tx() as conn:
        counted = conn.execute(
            sql("SELECT reltuples FROM pg_class WHERE oid = 'dtask_children'::regclass")
        ).scalar_one()
    large = max(LARGE_SPLIT, int(SHARE * max(counted, 0)) + 1)
    before = analyzed(store)
    split(store, large)
    # PostgreSQL 15 publishes a backend's table counters when it goes idle, a second apart
    wait_for(lambda: analyzed(store) > before, 30, "the split's ANALYZE to be counted")
    after = analyzed(store)
    split(store, 10)  # a small one leaves them as they are
    assert analyzed(store) == after


def test_a_masters_first_message_leaves_before_the_statistics_work(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split's ANALYZE (50-110 ms at 10,000 children) is not on its first child's path."""
    configure()  # the templates, as in a worker
    seen: list[str] = []
    monkeypatch.setattr(dispatcher, "nudge", lambda: seen.append("first message"))
    monkeypatch.setattr(statistics, "after_split", lambda db, n: seen.append(f"analyze {n}"))
    run_id, _ = store.runs.create(
        NewRun("tiny", f"test:{uuid.uuid4()}", {"n": 3, "fail_every": 0}, 1, None)
    )
    try:
        assert run_master(store, run_id) is RunState.RUNNING
    finally:
        store.runs.cancel(run_id)
    assert seen == ["first message", "analyze 3"]
