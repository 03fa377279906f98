"""A message of short children (``dtask.children``) taken for the first time writes their
successes together: four statements for the message, not two per child. Each child is still
fenced on its own and counts its attempt once. Run in this process, on the real PostgreSQL,
which these count the statements of; the held successes' logic (a takeover while one waits, a
long child's heartbeat) is tested on the in-memory store, tests/unit/test_batch_held.py."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dtask import services
from dtask.db import Store
from dtask.domain.runs import ChildState, NewRun, RunState
from dtask.worker import received
from dtask.worker.batch import children as children_message
from tests.support.db import children


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    from dtask.worker import configure

    configure()  # what a worker does first: its broker and backend, the templates ("tiny")
    return services.store()


def split(store: Store, n: int) -> tuple[int, list[list[Any]]]:
    run_id, _ = store.runs.create(NewRun("tiny", f"test:{uuid.uuid4()}", {"n": n}, 1, None))
    plan = [{"i": i, "fail_every": 0} for i in range(n)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    return run_id, [[i, spec] for i, spec in enumerate(plan)]


def test_each_child_of_a_message_is_written_once(
    store: Store, statements: list[str], sink: Path
) -> None:
    n = 40
    run_id, items = split(store, n)
    statements.clear()
    began = time.monotonic()
    children_message.apply(args=(run_id, "tiny", f"group-{uuid.uuid4()}", None, items))
    took = time.monotonic() - began
    writes = [s for s in statements if "dtask_children" in s]

    assert children(run_id) == [(i, "succeeded", 1) for i in range(n)]
    ran = (sink / f"{run_id}.tiny").read_text().split()[::2]
    assert Counter(int(i) for i in ran) == Counter(range(n))
    # the claim of them all, their successes, the run's last-child check and its finalize's
    # count: 2 n + 4 before (a start and a finish per child), n + 4 with one statement per
    # child. Within received.UNWRITTEN_FOR of the claim the successes are held and written
    # together; a message that outlasts it (a busy machine: seen in a full run) writes each
    # later child's start with the successes before it, still once per child at most.
    held = took < received.UNWRITTEN_FOR
    most = 4 + n // 4 if held else 4 + n
    assert len(writes) <= most, (took, Counter(s.split(" SET")[0][:60] for s in writes))


def test_children_taken_before_count_their_attempts_as_they_start(
    store: Store, statements: list[str]
) -> None:
    """A message's children handed back unstarted (a drain) are not taken for the first time
    when they come again: each writes its start, so a worker killed while one runs spends
    that child's attempt (a child that kills its worker cannot come back uncounted for
    ever)."""
    n = 10
    run_id, items = split(store, n)
    taken = store.children.claim_many(run_id, list(range(n)), "drained:1", 30)
    assert all(not claim.counted for claim in taken.values())
    # in its first attempt, counted only as it ends: 1 to whoever looks meanwhile
    shown = store.children.page(run_id, ChildState.RUNNING, n, None)
    assert [(c.index, c.attempt) for c in shown] == [(i, 1) for i in range(n)]
    assert store.children.detail(run_id, 0).attempt == 1  # type: ignore[union-attr]
    for claim in taken.values():
        store.children.unclaim(claim)
    statements.clear()
    children_message.apply(args=(run_id, "tiny", f"group-{uuid.uuid4()}", None, items))
    # a start each (with the success before it), and the last success: one write for all,
    # if they had been taken for the first time
    writes = [s for s in statements if "attempt = attempt + 1" in s and "dtask_children" in s]
    assert len(writes) == n + 1
    assert children(run_id) == [(i, "succeeded", 1) for i in range(n)]
