"""A dispatcher's pass commits what it took before it publishes (dtask/worker/dispatcher.py):
a worker that claims a message the moment it arrives finds the message's row and claims it
as one (docs/design/message-claims.md), against PostgreSQL, the broker's publish replaced by
that claim. Published inside the pass's transaction, the message raced its row: claimed child
by child, and its row, committed after, looked queued until the reaper's stall timeout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

import tests.support.templates  # noqa: F401  (registers `straggler`)
from dtask import services
from dtask.db import Claim, Store
from dtask.domain.runs import NewRun, RunState
from dtask.worker import dispatcher
from tests.integration.test_busy_steal import NoBroker, a_pass, spec


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    store: Store = services.store()
    yield store
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM dtask_workers WHERE name LIKE 'pass-then-publish-%'"))


def test_a_message_claimed_as_it_is_published_is_claimed_as_one_row(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = f"pp{uuid.uuid4().hex[:8]}"
    run_id, _ = store.runs.create(NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, queue))
    plan = [spec(i, i) for i in range(40)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    store.children.note_time(run_id, 0.0001)  # measured: its children go many to a message
    store.workers.report(f"pass-then-publish-{uuid.uuid4().hex[:8]}", [queue], 2, 0, 0)
    claims: list[Claim] = []

    def claim_as_sent(messages: Any, priority: int = 0, through: Any = None, **_: Any) -> int:
        for m in messages:
            taken = store.children.claim_many(run_id, [c.index for c in m], "test:1", 60)
            claims.extend(taken.values())
        return sum(len(m) for m in messages)

    monkeypatch.setattr(dispatcher, "send", claim_as_sent)
    monkeypatch.setattr(dispatcher, "_here", dispatcher.Dispatcher(sender=NoBroker()))
    try:
        a_pass(dispatcher.loop(services.current().settings))
        assert len(claims) > 1, "the pass sent nothing"
        assert all(c.message is not None for c in claims), "claimed child by child"
        with store.engine.connect() as conn:
            queued = conn.execute(
                text(
                    "SELECT count(*) FROM dtask_messages WHERE run_id = :r AND claimed_at IS NULL"
                ),
                {"r": run_id},
            ).scalar_one()
        assert queued == 0, "a message claimed already looks queued"
    finally:
        store.runs.cancel(run_id)


def test_a_publish_that_fails_once_goes_on_a_fresh_connection(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher's own broker connection may have gone stale between passes: a publish
    that fails is tried once more on a new one, so its children go now, not after the
    reaper's stall timeout (they were taken, and committed, before it)."""
    queue = f"pp{uuid.uuid4().hex[:8]}"
    run_id, _ = store.runs.create(NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, queue))
    plan = [spec(i, i) for i in range(10)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    store.workers.report(f"pass-then-publish-{uuid.uuid4().hex[:8]}", [queue], 2, 0, 0)
    calls: list[int] = []
    sent: list[int] = []

    class Stale(NoBroker):
        def close(self) -> None:
            calls.append(0)  # 0: the connection was closed

    def once_stale(messages: Any, priority: int = 0, through: Any = None, **_: Any) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("connection reset by peer")
        sent.extend(c.index for m in messages for c in m)
        return sum(len(m) for m in messages)

    monkeypatch.setattr(dispatcher, "send", once_stale)
    monkeypatch.setattr(dispatcher, "_here", dispatcher.Dispatcher(sender=Stale()))
    try:
        a_pass(dispatcher.loop(services.current().settings))
        assert calls[:3] == [1, 0, 1]
        assert sent, "nothing was sent on the fresh connection"
    finally:
        store.runs.cancel(run_id)
