"""Runs of one child taken together by a ``dtask.masters`` message (``InlineStore``): split in
one transaction, their children run in this process, their successes and the runs' with them
written in one. Run in this process on the real PostgreSQL, whose statements these count."""

from __future__ import annotations

import uuid
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Finished, Store
from dtask.db.database import RUN_LOCKS
from dtask.domain.runs import NewRun, RunState
from dtask.worker import inline_runs, tasks
from dtask.worker.messages import TEMPLATE_HEADER
from dtask.worker.tasks import master, masters
from tests.support.db import children

ONE = {"n": 1, "fail_every": 0}


@pytest.fixture
def store(dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Store:
    from dtask.worker import configure

    configure()  # what a worker does first: its broker and backend, the templates ("tiny")
    # this process has seen tiny's children take a millisecond: a message runs all its runs
    monkeypatch.setitem(inline_runs._child_seconds, "tiny", deque([0.001]))
    return services.store()


def create(store: Store, variables: dict[str, Any] = ONE, **options: Any) -> int:
    run_id, _ = store.runs.create(
        NewRun("tiny", f"test:{uuid.uuid4()}", variables, 2, None, **options)
    )
    return run_id


def plan(template: str, variables: dict[str, Any], slots: Any) -> list[dict[str, Any]] | None:
    if template != "tiny":
        return None
    return [{"i": i, "fail_every": variables["fail_every"]} for i in range(variables["n"])]


def test_a_message_s_runs_are_split_and_finished_together(
    store: Store, statements: list[str], sink: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the children start unwritten for as long as the message takes: a busy machine took
    # more than the shipped 0.25 s, and each start wrote (21 statements more)
    monkeypatch.setattr(inline_runs, "unwritten_for", lambda: 60.0)
    ids = [create(store) for _ in range(20)]
    failing = create(store, {"n": 1, "fail_every": 1})  # fails its first attempt
    statements.clear()
    masters.run("tiny", 0, [*ids, failing])
    sent = [s for s in statements if "dtask_" in s]
    # the split (2), the successes with their runs (3), the failed attempt's own writes
    print(f"\n{len(sent)} statements for 21 runs")
    assert len(sent) < 12, "\n".join(s[:80] for s in sent)
    for run_id in ids:
        assert store.runs.get(run_id).state is RunState.SUCCEEDED
        assert children(run_id) == [(0, "succeeded", 1)]
        assert (sink / f"{run_id}.tiny").read_text().count("\n") == 1
    assert children(failing) == [(0, "pending", 1)]  # counted once, handed over
    assert store.runs.get(failing).state is RunState.RUNNING


def test_runs_that_cannot_start_together_are_left_untouched(store: Store) -> None:
    plain = [create(store) for _ in range(3)]
    three = create(store, {"n": 3, "fail_every": 0})
    later = create(store, start_in=3600.0)
    cancelled = create(store)
    store.runs.cancel(cancelled)
    locked = create(store)
    given = [plain[0], three, later, plain[1], cancelled, locked, plain[2]]
    with store.engine.connect() as other:  # a master of its own holds this run's lock
        other.execute(text("SELECT pg_advisory_lock(:ns, :k)"), {"ns": RUN_LOCKS, "k": locked})
        taken, left = store.inline.split_many(given, plan, "me", 30.0)
        other.execute(text("SELECT pg_advisory_unlock_all()"))
        other.commit()
    assert [t.run_id for t in taken] == plain
    assert left == [three, later, locked]  # a cancelled run's master has nothing to do
    assert all(not t.claim.counted and t.claim.attempt == 1 for t in taken)
    for run_id in plain:
        assert store.runs.get(run_id).state is RunState.RUNNING
        assert children(run_id) == [(0, "running", 0)]
    for run_id in (three, later, locked):
        assert store.runs.get(run_id).state is RunState.PENDING
        assert children(run_id) == []


def test_a_success_whose_fence_moved_or_run_was_cancelled_is_not_written(store: Store) -> None:
    upstream, moved, cancelled = create(store), create(store), create(store)
    dependent = create(store, after=(upstream,))
    taken, _ = store.inline.split_many([upstream, moved, cancelled], plan, "me", 30.0)
    claims = {t.run_id: t.claim for t in taken}
    with store.engine.begin() as conn:  # another owner took this child over
        conn.execute(
            text("UPDATE dtask_children SET fence = fence + 1 WHERE id = :id"),
            {"id": claims[moved].child_id},
        )
    store.runs.cancel(cancelled)
    ended = store.inline.finish_many([(t.run_id, Finished(t.claim, None, "0")) for t in taken])
    assert (ended.succeeded, ended.released) == ([upstream], [dependent])
    assert store.runs.get(moved).state is RunState.RUNNING
    assert store.runs.get(cancelled).state is RunState.CANCELLED
    assert children(upstream) == [(0, "succeeded", 1)]
    assert children(moved) == [(0, "running", 0)]
    assert store.runs.get(dependent).state is RunState.PENDING


def test_a_master_takes_pending_runs_of_its_template_and_priority_with_its_own(
    store: Store,
) -> None:
    first = create(store, priority=3)
    others = [create(store, priority=3) for _ in range(4)]
    higher = create(store, priority=7)
    later = create(store, priority=3, start_in=3600.0)
    elsewhere, _ = store.runs.create(NewRun("not_tiny", f"test:{uuid.uuid4()}", {}, 1, None))
    taken, left = store.inline.split_many([first], plan, "me", 30.0, siblings=3)
    assert ([t.run_id for t in taken], left) == ([first, *others[:3]], [])
    for run_id in (others[3], higher, later, elsewhere):
        assert store.runs.get(run_id).state is RunState.PENDING
    # a taken run's own master, when it comes, takes the one left, and nothing of its own
    again, left = store.inline.split_many([others[0]], plan, "me", 30.0, siblings=3)
    assert ([t.run_id for t in again], left) == ([others[3]], [])


def test_a_master_message_naming_its_template_runs_its_siblings_with_it(
    store: Store, statements: list[str], sink: Path
) -> None:
    ids = [create(store) for _ in range(10)]
    statements.clear()
    master.apply(args=(ids[0],), headers={TEMPLATE_HEADER: "tiny"})
    sent = [s for s in statements if "dtask_" in s]
    assert len(sent) < 8, "\n".join(s[:90] for s in sent)
    for run_id in ids:
        assert store.runs.get(run_id).state is RunState.SUCCEEDED
        assert (sink / f"{run_id}.tiny").read_text().count("\n") == 1
    statements.clear()
    master.apply(args=(ids[5],), headers={TEMPLATE_HEADER: "tiny"})  # its own, late
    assert len([s for s in statements if "dtask_" in s]) == 1


def test_a_masters_message_of_cancelled_runs_sends_nothing_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that has not seen the template's children runs one run of a message and
    sends the rest back; runs cancelled meanwhile are not among them (an operator's cancel
    of a backlog had sent its messages round, a run a hop: 473 messages for 300 runs)."""
    monkeypatch.delitem(inline_runs._child_seconds, "tiny")
    sent: list[list[int]] = []
    monkeypatch.setattr(tasks, "_send_back", lambda template, priority, ids: sent.append(ids))
    ids = [create(store) for _ in range(6)]
    for run_id in ids[1:5]:
        store.runs.cancel(run_id)
    masters.run("tiny", 0, ids)
    assert sent == [[ids[5]]]
    assert store.runs.get(ids[0]).state is RunState.SUCCEEDED
