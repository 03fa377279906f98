"""A large split leaves dtask_children with statistics that describe it (dtask.db.statistics):
without them the run's claims and releases were planned for the table as autovacuum last saw
it, and read every pending child of the run per message."""

from __future__ import annotations

import uuid

import pytest

from dtask import services
from dtask.db import Store
from dtask.db.database import sql
from dtask.db.statistics import LARGE_SPLIT, SHARE
from dtask.domain.runs import NewRun, RunState
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
