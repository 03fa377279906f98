"""Straggler stealing while children wait (docs/elastic.md, "When"), through the dispatcher's
loop (dtask/worker/dispatcher.py ``loop``) against PostgreSQL, live workers as the test
declares them and the broker's publish recorded instead: a queue whose slots outnumber its
children out after a pass gets its straggler cut even while another queue (or a client held
by its cap) still has children waiting, the queue whose waiting children took its slots gets
none, and a busy cluster asks at most once every ten dispatch intervals."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

import tests.support.templates  # noqa: F401  (registers `straggler`, a range template)
from dtask import services
from dtask.db import Claim, Finished, Store
from dtask.domain.runs import NewRun, RunState
from dtask.worker import dispatcher
from dtask.worker.messages import Sender


class NoBroker(Sender):
    @property
    def producer(self) -> Any:
        return None


def queue() -> str:
    return f"sq{uuid.uuid4().hex[:8]}"


def spec(a: int, b: int) -> dict[str, Any]:
    return {"a": a, "b": b, "delay": 0.0, "slow": [0, 0]}


def straggling(store: Store, queue: str) -> int:
    """A running run of ``straggler``: child 0 ([1, 100]) has done 10 numbers in its first
    second (90 left: 9 s at its rate, worth cutting), child 1 has finished."""
    new = NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, queue)
    run_id, _ = store.runs.create(new)
    plan = [spec(1, 100), spec(101, 110)]
    assert store.runs.split(run_id, lambda run, slots: plan) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, sent: None) is RunState.RUNNING
    slow = store.children.claim(run_id, 0, "test", 60)
    fast = store.children.claim(run_id, 1, "test", 60)
    assert isinstance(slow, Claim) and isinstance(fast, Claim)
    store.children.finish(fast, None)
    store.children.checkpoint(slow, {"done": 10}, 60)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE dtask_children SET started_at = now() - interval '1 second'"
                " WHERE run_id = :r AND index = 0"
            ),
            {"r": run_id},
        )
    return run_id


def waiting(store: Store, queue: str, children: int = 20) -> int:
    """A running run whose ``children`` wait for the dispatcher."""
    run_id, _ = store.runs.create(NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, queue))
    plan = [spec(i, i) for i in range(children)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    return run_id


def asked(run_id: int) -> bool:
    with services.store().engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT give_away FROM dtask_children WHERE run_id = :r AND index = 0"),
                {"r": run_id},
            ).scalar_one()
        )


@pytest.fixture
def world(dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    """The session's store, workers this test reports (gone after it), nothing published."""
    store: Store = services.store()
    sent: list[int] = []

    def send(messages: Any, priority: int = 0, through: Any = None, **_: Any) -> int:
        sent.extend(c.run_id for m in messages for c in m)
        return sum(len(m) for m in messages)

    monkeypatch.setattr(dispatcher, "send", send)
    monkeypatch.setattr(dispatcher, "_here", dispatcher.Dispatcher(sender=NoBroker()))
    yield store
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM dtask_workers WHERE name LIKE 'busy-steal-%'"))
    for run_id in list(_runs):
        store.runs.cancel(run_id)
    _runs.clear()


_runs: list[int] = []


def worker(store: Store, queue: str, slots: int) -> None:
    store.workers.report(f"busy-steal-{uuid.uuid4().hex[:8]}", [queue], slots, 0, 0)


def a_pass(loop: Any) -> int:
    """The loop's next pass that has the cluster's turn: how many runs had children waiting."""
    deadline = time.monotonic() + 30
    while (found := loop.once()) is None:
        assert time.monotonic() < deadline, "no dispatcher turn within 30 s"
        time.sleep(0.01)
    return int(found)


def passes_until_asked(run_id: int) -> None:
    """Busy passes (children still wait after each) until the run's straggler is asked: a
    busy cluster asks once every ten dispatch intervals, so within a second here."""
    loop = dispatcher.loop(services.current().settings)
    deadline = time.monotonic() + 30
    while not asked(run_id):
        assert time.monotonic() < deadline, "a straggler beside free slots never asked"
        assert a_pass(loop) >= 1  # children still wait: each pass is a busy one


def test_a_busy_pass_still_cuts_a_straggler_where_slots_are_free(world: Store) -> None:
    busy, idle = queue(), queue()
    worker(world, busy, 2)
    worker(world, idle, 2)
    _runs.extend(
        [
            backlog := waiting(world, busy),
            behind := straggling(world, busy),  # its queue's slots go to the backlog
            alone := straggling(world, idle),  # one slot of two works, nothing waits
        ]
    )
    passes_until_asked(alone)
    assert not asked(behind), "the backlog's children fill its queue's slots"
    assert backlog


def test_a_client_at_its_cap_leaves_its_slots_to_a_straggler(world: Store) -> None:
    """Children wait in the queue itself, held by their client's --max-running: the slots
    they cannot take are free, and the straggler beside them is asked."""
    from dtask.client.clients import set_client

    q, held = queue(), f"c{uuid.uuid4().hex[:8]}"
    set_client(held, max_running=1)
    worker(world, q, 3)
    run_id, _ = world.runs.create(
        NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, q, client=held)
    )
    plan = [spec(i, i) for i in range(10)]
    assert world.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert world.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    _runs.extend([run_id, alone := straggling(world, q)])
    passes_until_asked(alone)


def test_a_busy_cluster_asks_at_most_once_every_ten_intervals(
    world: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = queue()
    worker(world, q, 1)
    _runs.append(waiting(world, q, 1_000))
    settings = services.current().settings
    asks: list[float] = []
    real = dispatcher.ask

    def counted(settings: Any) -> int:
        asks.append(time.monotonic())
        return real(settings)

    monkeypatch.setattr(dispatcher, "ask", counted)
    loop = dispatcher.loop(settings)
    began = time.monotonic()
    for _ in range(30):
        assert a_pass(loop) >= 1
    elapsed = time.monotonic() - began
    assert 1 <= len(asks) <= 1 + elapsed / (10 * settings.dispatch_interval), (asks, elapsed)


def test_a_message_with_children_behind_its_straggler_takes_one_slot(world: Store) -> None:
    """A message the dispatcher sent, claimed as one row, runs its children one after the
    other in one pool process: one slot, however many of its children are still to run. Its
    straggler (child 10, in its middle) is cut where the queue's other slots are free, at the
    rate it has run since it started, not since its first checkpoint."""
    q = queue()
    run_id, _ = world.runs.create(NewRun("straggler", f"test:{uuid.uuid4()}", {}, 1, q))
    _runs.append(run_id)
    plan = [spec(i, i) for i in range(10)] + [spec(10, 109)] + [spec(i, i) for i in range(110, 149)]
    assert world.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert world.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    with world.dispatch.turn(wait=10) as turn:
        assert turn is not None
        assert [len(m) for m in turn.take(run_id, len(plan), len(plan))] == [len(plan)]
    claims = world.children.claim_many(run_id, list(range(len(plan))), "test:1", 60)
    assert all(c.message is not None for c in claims.values())
    ended = [claims[i] for i in range(10)]
    world.children.write_batch([Finished(c, None, None, None) for c in ended], None, 60)
    # its start was not written: its first checkpoint dates it back by what its attempt ran,
    # so its rate (10 numbers a second: 9 s left) is its own
    world.children.checkpoint(claims[10], {"done": 10}, 60, ran=1.0)
    worker(world, q, 4)  # 39 children wait behind the straggler, in its message: 1 slot of 4
    assert dispatcher.ask(services.current().settings) >= 1
    with world.engine.connect() as conn:
        flagged = conn.execute(
            text("SELECT give_away FROM dtask_children WHERE run_id = :r AND index = 10"),
            {"r": run_id},
        ).scalar_one()
    assert flagged
