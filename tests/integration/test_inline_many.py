"""Runs of one child taken together by a ``dtask.masters`` message (``InlineStore``): split in
one transaction, their children run in this process, their successes and the runs' with them
written in one. Run in this process on the real PostgreSQL, whose statements these count."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from dtask import services
from dtask.db import Finished, Store
from dtask.db.database import RUN_LOCKS
from dtask.domain.runs import NewRun, RunState
from dtask.worker import inline_runs
from dtask.worker.tasks import masters
from tests.support.db import children

ONE = {"n": 1, "fail_every": 0}


@pytest.fixture
def store(dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Store:
    from dtask.worker import configure

    configure()  # what a worker does first: its broker and backend, the templates ("tiny")
    # this process has seen tiny's children take a millisecond: a message runs all its runs
    monkeypatch.setitem(inline_runs._child_seconds, "tiny", 0.001)
    return services.store()


@pytest.fixture
def statements() -> Iterator[list[str]]:
    sent: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", note)


def create(store: Store, variables: dict[str, Any] = ONE, **options: Any) -> int:
    run_id, _ = store.runs.create(
        NewRun("tiny", f"test:{uuid.uuid4()}", variables, 2, None, **options)
    )
    return run_id


def plan(variables: dict[str, Any], slots: Any) -> list[dict[str, Any]]:
    return [{"i": i, "fail_every": variables["fail_every"]} for i in range(variables["n"])]


def test_a_message_s_runs_are_split_and_finished_together(
    store: Store, statements: list[str], sink: Path
) -> None:
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
        taken, left = store.inline.split_many(given, "tiny", plan, "me", 30.0)
        other.execute(text("SELECT pg_advisory_unlock_all()"))
        other.commit()
    assert [run_id for run_id, _ in taken] == plain
    assert left == [three, later, cancelled, locked]
    assert all(not claim.counted and claim.attempt == 1 for _, claim in taken)
    for run_id in plain:
        assert store.runs.get(run_id).state is RunState.RUNNING
        assert children(run_id) == [(0, "running", 0)]
    for run_id in (three, later, locked):
        assert store.runs.get(run_id).state is RunState.PENDING
        assert children(run_id) == []


def test_a_success_whose_fence_moved_or_run_was_cancelled_is_not_written(store: Store) -> None:
    upstream, moved, cancelled = create(store), create(store), create(store)
    dependent = create(store, after=(upstream,))
    taken, _ = store.inline.split_many([upstream, moved, cancelled], "tiny", plan, "me", 30.0)
    claims = dict(taken)
    with store.engine.begin() as conn:  # another owner took this child over
        conn.execute(
            text("UPDATE dtask_children SET fence = fence + 1 WHERE id = :id"),
            {"id": claims[moved].child_id},
        )
    store.runs.cancel(cancelled)
    ended = store.inline.finish_many(
        [(run_id, Finished(claim, None, "0")) for run_id, claim in taken]
    )
    assert (ended.succeeded, ended.released) == ([upstream], [dependent])
    assert store.runs.get(moved).state is RunState.RUNNING
    assert store.runs.get(cancelled).state is RunState.CANCELLED
    assert children(upstream) == [(0, "succeeded", 1)]
    assert children(moved) == [(0, "running", 0)]
    assert store.runs.get(dependent).state is RunState.PENDING
