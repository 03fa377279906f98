"""A dispatcher's pass publishes in its transaction (passes publish in the order they take:
a high-priority run's children stay ahead on RabbitMQ's FIFO queue), so a worker may claim a
message before the pass has committed its row. The claim then waits for the pass and finds
the row: the message is claimed as one (docs/design/message-claims.md). Against PostgreSQL,
the broker's publish replaced by a claim from another thread. Before, such a message was
claimed child by child, and its row, committed after, looked queued until the reaper's stall
timeout (on RabbitMQ, often)."""

from __future__ import annotations

import threading
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


def test_a_message_claimed_before_its_pass_commits_is_claimed_as_one_row(
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
    claimers: list[threading.Thread] = []

    def claim_as_sent(messages: Any, priority: int = 0, through: Any = None, **_: Any) -> int:
        for m in messages:

            def claim(indexes: list[int] = [c.index for c in m]) -> None:  # noqa: B006
                claims.extend(store.children.claim_many(run_id, indexes, "test:1", 60).values())

            claimer = threading.Thread(target=claim)
            claimer.start()
            claimer.join(0.5)  # a worker as quick as the broker: before the pass commits
            claimers.append(claimer)
        return sum(len(m) for m in messages)

    monkeypatch.setattr(dispatcher, "send", claim_as_sent)
    monkeypatch.setattr(dispatcher, "_here", dispatcher.Dispatcher(sender=NoBroker()))
    try:
        a_pass(dispatcher.loop(services.current().settings))
        for claimer in claimers:
            claimer.join(30)
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
    that fails is tried once more on a new one, so its children go now, not at the next pass
    (that one's fails too on the same stale connection)."""
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
