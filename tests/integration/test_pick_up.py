"""``RunStore.pick_up``: the runs single submits left to a pickup (dtask/worker/pickup.py),
read once each, the highest priority and oldest first, grouped by template and priority."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dtask import services
from dtask.db import Store
from dtask.domain.runs import NewRun


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    store = services.store()
    store.runs.pick_up(10_000)  # earlier tests' leftovers
    return store


def create(store: Store, template: str = "tiny", **options: Any) -> int:
    run = NewRun(template, f"test:{uuid.uuid4()}", {}, 1, None, awaits_pickup=True, **options)
    run_id, _ = store.runs.create(run)
    return run_id


def test_each_run_awaiting_a_pickup_is_read_once_in_priority_order(store: Store) -> None:
    low = create(store, priority=2)
    first, other, second = create(store), create(store, "noop"), create(store)
    high = create(store, priority=8)
    create(store, start_in=3600.0)
    store.runs.create(NewRun("tiny", f"test:{uuid.uuid4()}", {}, 1, None))  # its own master
    cancelled = create(store)
    store.runs.cancel(cancelled)
    picked = store.runs.pick_up(3)
    assert picked == [(high, "tiny", 8), (other, "noop", 5), (first, "tiny", 5)]
    assert store.runs.pick_up(100) == [(second, "tiny", 5), (low, "tiny", 2)]
    # a run once; none due later (``later``), sent its own master, or cancelled
    assert store.runs.pick_up(100) == []
