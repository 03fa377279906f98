"""A message of short children (``dtask.children``, dtask/worker/batch.py) holding its
successes (``Held``) until a write goes anyway, run in this process against the in-memory
store (tests/support/memory.py, held to the real store's rules by tests/contract). The
statements each path sends are counted on PostgreSQL in tests/integration/test_batch_writes.py."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

import dtask
from dtask.domain.dispatch import BATCH_SECONDS, batch_size
from dtask.settings import Settings
from dtask.worker.batch import children as children_message
from dtask.worker.child_store import Child
from dtask.worker.received import Received
from tests.support.memory import MemoryStore, install

CONFIG = Settings(lease_ttl=5.0, heartbeat_interval=0.5, retry_delay=0.0)
STORE: list[MemoryStore] = []


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    STORE[:] = [MemoryStore()]
    install(monkeypatch, STORE[0], CONFIG)
    return STORE[0]


def message(store: MemoryStore, template: str, n: int) -> int:
    """A run of ``n`` children of ``template``, split for the dispatcher, sent as one message."""
    specs = [{"i": i} for i in range(n)]
    run_id = store.runs.add(template, specs, max_attempts=1)
    store.runs.dispatch(run_id, lambda run, children: None, deferred=True)
    items = [[i, spec] for i, spec in enumerate(specs)]
    # the task's body, called as a worker calls it but without Celery's tracer, which would
    # build dtask's app's result backend (another test's URLs) to store a result
    children_message(run_id, template, f"dtask-{run_id}-1", None, items)
    return run_id


def states(store: MemoryStore, run_id: int) -> list[tuple[int, str, int]]:
    return [(c.index, c.state.value, c.attempt) for c in store.tables.of_run(run_id)]


@dtask.template(
    "taken_over_in_batch",
    params={"n": int},
    skeleton={"n": "${n}"},
    split=lambda r: [{"i": i} for i in range(r["n"])],
)
def taken_over_in_batch(ctx: dtask.ChildContext, i: int) -> int:
    """Child 2 is taken over by another worker (its fence moves) while it runs."""
    if i == 2:
        STORE[0].row(ctx.run_id, 2).fence += 1
    return i


def test_a_child_taken_over_while_its_success_waits_is_not_written_and_the_next_runs(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dtask.worker"):
        run_id = message(store, "taken_over_in_batch", 5)
    # child 2's attempt was to be counted with its success: the worker that took it over
    # counts its own as it starts
    assert states(store, run_id) == [
        (0, "succeeded", 1), (1, "succeeded", 1), (2, "running", 0),
        (3, "succeeded", 1), (4, "succeeded", 1),
    ]  # fmt: skip
    assert "was taken over by another worker" in caplog.text


@dtask.template(
    "long_after_short",
    params={"n": int},
    skeleton={"n": "${n}"},
    split=lambda r: [{"i": i} for i in range(r["n"])],
)
def long_after_short(ctx: dtask.ChildContext, i: int) -> bool:
    """The last child outlasts a heartbeat: whether it saw the others' successes written
    while it ran."""
    if i < 3:
        return True
    deadline = time.monotonic() + 4 * CONFIG.heartbeat_interval
    while time.monotonic() < deadline:
        if [c.state.value for c in STORE[0].tables.of_run(ctx.run_id)[:3]] == ["succeeded"] * 3:
            return True
        time.sleep(0.01)
    return False


def test_a_long_child_writes_the_successes_held_before_it_with_its_heartbeat(
    store: MemoryStore,
) -> None:
    """Held successes' leases run from the message's claim: a child that runs longer than
    they last must not leave them unwritten (they would be taken and run again elsewhere)."""
    run_id = message(store, "long_after_short", 4)
    assert states(store, run_id) == [(i, "succeeded", 1) for i in range(4)]
    assert store.row(run_id, 3).result is True
    assert store.runs.get(run_id).state.value == "succeeded"
    assert store.tables.runs[run_id].child_seconds is not None  # the message noted its time


@dtask.template("quick", params={}, skeleton={}, split=lambda r: [{}])
def quick(ctx: dtask.ChildContext) -> None:
    return None


def test_a_slow_database_does_not_make_short_children_look_long(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's noted time is its function's: a claim or finish slowed by a busy database is
    what several children to a message save, so it must not keep them one to a message."""
    run_id = store.runs.add("quick", [{}], max_attempts=1)
    store.runs.dispatch(run_id, lambda run, children: None, deferred=True)
    claim = store.children.claim

    def slow_claim(*args: Any, **kwargs: Any) -> Any:
        time.sleep(2 * BATCH_SECONDS)
        return claim(*args, **kwargs)

    monkeypatch.setattr(store.children, "claim", slow_claim)
    received = Received([Child(run_id, 0, "quick", {})])
    received.run()
    [took] = received.took
    assert batch_size(took) > 1, took
    assert states(store, run_id) == [(0, "succeeded", 1)]
