"""A message of several children the dispatcher sent is one row of ``dtask_messages``, its
children unwritten (issue 59): when the broker loses it, the reaper finds it by that row and
re-sends its children, each on its own, once (real PostgreSQL and Redis, no worker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import Claim, Store
from dtask.domain.runs import NewRun, RunState
from dtask.worker import configure
from dtask.worker.reaper import queue_size
from tests.integration.test_reaper import lead_a_pass
from tests.integration.test_reaper import sql as run_sql


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    configure()
    yield services.store()


def window_run(store: Store, queue: str, children: int) -> int:
    run_id, _ = store.runs.create(
        NewRun("print_range", f"test:{uuid.uuid4()}", {"n": children}, 3, queue)
    )
    plan = [{"a": i, "b": i} for i in range(children)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    return run_id


def rows(run_id: int, query: str) -> list[tuple[object, ...]]:
    with services.store().engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(query), {"r": run_id})]


def test_a_message_of_several_lost_in_the_broker_is_re_sent_child_by_child_once(
    store: Store,
) -> None:
    queue = f"lost-{uuid.uuid4().hex[:8]}"
    run_id = window_run(store, queue, 7)
    with store.dispatch.turn() as turn:  # taken, never published: lost on the way
        assert turn is not None
        sent = [[c.index for c in m] for m in turn.take(run_id, 7, 3)]
    assert sent == [[0, 1, 2], [3, 4, 5], [6]]
    assert isinstance(store.children.claim_many(run_id, [3, 4, 5], "w:1", 30)[3], Claim)
    assert queue_size(queue) == 0
    for table in ("dtask_messages", "dtask_children"):  # a stall timeout ago and more
        run_sql(
            f"UPDATE {table} SET sent_at = sent_at - interval '1 hour' WHERE run_id = :r", r=run_id
        )
    [waiting] = [w for w in store.recovery.waiting(60) if w.queue == queue]
    assert (waiting.pending, waiting.overdue) == (4, 4)  # 0-2 in their message, 6 alone
    assert lead_a_pass().resent == 4
    assert queue_size(queue) == 4  # the taken message's children are not re-sent
    pending = "SELECT index FROM dtask_children WHERE run_id = :r AND state = 'pending'"
    assert rows(run_id, pending + " AND sent_at > now() - interval '1 minute' ORDER BY index") == [
        (0,), (1,), (2,), (6,),
    ]  # fmt: skip
    assert (
        rows(run_id, "SELECT lo FROM dtask_messages WHERE run_id = :r AND claimed_at IS NULL") == []
    )
    lead_a_pass()
    assert queue_size(queue) == 4  # once per stall timeout: they were sent just now
    run_sql("DELETE FROM dtask_lost_messages WHERE queue = :q", q=queue)  # no alert for it
