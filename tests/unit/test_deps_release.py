"""What a run's end releases (dtask/worker/finalize.py ``finalize_run``, ``start_released``):
the masters of the dependents whose every upstream has succeeded are sent, once, by the
finalize that released them; a master that cannot be sent leaves its run pending for the
reaper and the others go. In this process against the in-memory store (tests/support/memory.py,
held to the real store's release rules by tests/contract/test_deps_store.py); the same on real
workers: tests/acceptance/test_dependencies.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import dtask
from dtask.db import Claim
from dtask.domain.runs import NewRun, RunState
from dtask.settings import Settings
from dtask.worker import finalize
from tests.support.memory import MemoryStore, install


@dtask.template("released_here", params={}, skeleton={}, split=lambda r: [{"i": 0}])
def released_here(ctx: dtask.ChildContext, i: int) -> None:
    """A template this process knows, without a reduce: its runs finalize here."""


MASTERS: list[int] = []  # the runs whose master was sent
UNSENDABLE: set[int] = set()  # the runs whose master the broker refuses


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    memory = MemoryStore()
    install(monkeypatch, memory, Settings())
    MASTERS.clear()

    def send_master(run_id: int, through: Any = None, **options: Any) -> None:
        if run_id in UNSENDABLE:
            raise ConnectionError("broker unreachable")
        MASTERS.append(run_id)

    monkeypatch.setattr(finalize, "send_master", send_master)
    UNSENDABLE.clear()
    return memory


def create(store: MemoryStore, *after: int) -> int:
    new = NewRun("released_here", f"k{len(store.tables.runs)}", {}, 1, None, after=after)
    run_id, _ = store.runs.create(new)
    return run_id


def running(store: MemoryStore, *after: int) -> int:
    run_id = create(store, *after)
    store.runs.split(run_id, lambda run, slots: [{"i": 0}])
    store.runs.dispatch(run_id, lambda run, children: None)
    return run_id


def end(store: MemoryStore, run_id: int, ok: bool = True) -> RunState:
    """Its child ends, then the run is finalized as its last child's task does."""
    claim = store.children.claim(run_id, 0, "me", 30)
    assert isinstance(claim, Claim), claim
    if ok:
        store.children.finish(claim, None)
    else:
        store.children.fail_attempt(claim, "boom")
    return finalize.finalize_run(store, run_id)


def test_the_last_upstream_s_finalize_sends_the_dependent_s_master_once(
    store: MemoryStore,
) -> None:
    a, b = running(store), running(store)
    both, only_a = create(store, a, b), create(store, a)
    assert end(store, a) is RunState.SUCCEEDED
    assert [only_a] == MASTERS
    assert end(store, b) is RunState.SUCCEEDED
    assert [only_a, both] == MASTERS
    assert finalize.finalize_run(store, b) is RunState.SUCCEEDED  # a late duplicate finalize
    assert [only_a, both] == MASTERS


def test_a_failed_upstream_sends_no_master_and_fails_what_waits(store: MemoryStore) -> None:
    a, ok = running(store), running(store)
    down = create(store, a, ok)
    assert end(store, ok) is RunState.SUCCEEDED
    assert end(store, a, ok=False) is RunState.FAILED
    assert MASTERS == []
    assert store.runs.status(down).error == f"upstream run {a} failed"


def test_a_master_that_cannot_be_sent_is_left_to_the_reaper_and_the_others_go(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    a = running(store)
    first, second = create(store, a), create(store, a)
    UNSENDABLE.add(first)
    with caplog.at_level(logging.WARNING, logger="dtask.worker"):
        assert end(store, a) is RunState.SUCCEEDED
    assert [second] == MASTERS
    assert store.runs.status(first).state is RunState.PENDING  # the reaper's stuck-run step
    assert f"run {first}: released, its master not sent (the reaper will)" in caplog.text
