"""The dispatcher's store against a real PostgreSQL: deferred children, taking them in order,
the unsent count, a rerun's children waiting again, one pass at a time."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from dtask import services
from dtask.db import Claim, Refusal, Store
from dtask.db.database import sql
from dtask.db.dispatch import Out
from dtask.db.inline import Inline
from dtask.domain.clients import HIGHEST_PRIORITY, LOWEST_PRIORITY, Client
from dtask.domain.runs import ClaimRefusal, NewRun, RunState
from dtask.exceptions import LeaseLost


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def deferred_run(store: Store, children: int) -> int:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    plan = [{"i": i} for i in range(children)]
    assert store.runs.split(run_id, lambda run: plan, deferred=True) is RunState.SPLITTING
    sizes: list[int] = []
    state = store.runs.dispatch(run_id, lambda run, kids: sizes.append(len(kids)), deferred=True)
    assert (state, sizes) == (RunState.RUNNING, [0])  # the chord is fixed, nothing is sent
    return run_id


def unsent(store: Store, run_id: int) -> int:
    with store.dispatch.turn() as turn:
        assert turn is not None
        return next(d.unsent for ds in turn.demands().values() for d in ds if d.run_id == run_id)


def test_deferred_children_are_taken_in_order_and_counted(store: Store) -> None:
    run_id = deferred_run(store, 5)
    assert unsent(store, run_id) == 5
    with store.dispatch.turn() as turn:
        assert turn is not None
        before = turn.out()[0].get(None)
        assert [c.index for c in turn.take(run_id, 3)] == [0, 1, 2]
        after = turn.out()[0][None]
        assert after.queued - (before.queued if before else 0) == 3
    assert unsent(store, run_id) == 2
    with store.dispatch.turn() as turn:
        assert turn is not None
        assert [c.index for c in turn.take(run_id, 10)] == [3, 4]
        assert run_id not in {d.run_id for ds in turn.demands().values() for d in ds}


def test_one_pass_at_a_time(store: Store) -> None:
    with store.dispatch.turn() as first:
        assert first is not None
        with store.dispatch.turn() as second:
            assert second is None


def test_a_rerun_s_children_wait_for_the_dispatcher_again(store: Store) -> None:
    run_id = deferred_run(store, 2)
    with store.dispatch.turn() as turn:
        assert turn is not None
        turn.take(run_id, 2)
    for index in (0, 1):
        claim = store.children.claim(run_id, index, "me", 30)
        assert isinstance(claim, Claim)
        store.children.fail_attempt(claim, "boom")  # one attempt only: failed for good
    assert store.runs.finalize(run_id) is RunState.FAILED
    assert store.runs.rerun(run_id) is RunState.SPLITTING
    store.runs.dispatch(run_id, lambda run, kids: None, deferred=True)
    assert unsent(store, run_id) == 2


def new_client(store: Store) -> str:
    name = f"c-{uuid.uuid4()}"
    store.clients.save(Client(name))
    return name


def waiting_run(
    store: Store, client: str, queue: str | None, template: str = "t", priority: int = 5
) -> int:
    run_id, _ = store.runs.create(
        NewRun(template, f"test:{uuid.uuid4()}", {}, 1, queue, client=client, priority=priority)
    )
    store.runs.split(run_id, lambda run: [{"i": 0}, {"i": 1}], deferred=True)
    store.runs.dispatch(run_id, lambda run, kids: None, deferred=True)
    return run_id


def test_a_pass_reads_only_the_head_of_each_client_s_runs_in_the_order_it_sends(
    store: Store,
) -> None:
    client, other = new_client(store), new_client(store)
    head = [waiting_run(store, client, "qa", priority=p) for p in (1, 9, 5, 5, 5, 1, 9, 0)]
    soon = datetime.now(UTC) + timedelta(minutes=5)
    with store.db.tx() as conn:  # within priority 5 the one with a deadline goes first
        conn.execute(
            sql("UPDATE dtask_runs SET deadline = :d WHERE id = :id"), {"d": soon, "id": head[4]}
        )
    u = [waiting_run(store, client, "qa", template="u") for _ in range(2)]
    default = waiting_run(store, client, None)
    theirs = [waiting_run(store, other, "qa") for _ in range(6)]
    with store.dispatch.turn() as turn:
        assert turn is not None
        demands = turn.demands(per_client=4)
    qa = [d.run_id for d in demands["qa"] if d.client == client and d.template == "t"]
    assert qa == [head[1], head[6], head[4], head[2]]  # priority, then deadline, then id
    assert [d.run_id for d in demands["qa"] if d.template == "u" and d.client == client] == u
    assert [d.run_id for d in demands["qa"] if d.client == other] == theirs[:4]
    assert default in {d.run_id for d in demands[None] if d.client == client}
    for queue, waiting in demands.items():  # never more than the head of any group
        groups = Counter((d.client, d.template) for d in waiting)
        assert max(groups.values()) <= 4, (queue, groups)


def test_what_is_out_is_counted_per_queue_and_client(store: Store) -> None:
    client = new_client(store)
    runs = [waiting_run(store, client, "qb") for _ in range(3)]
    with store.dispatch.turn() as turn:
        assert turn is not None
        for run_id in runs:
            turn.take(run_id, 2)
    claim = store.children.claim(runs[0], 0, "me", 30)
    assert isinstance(claim, Claim)
    with store.dispatch.turn() as turn:
        assert turn is not None
        queues, clients = turn.out()
        assert queues["qb"] == Out(queued=5, running=1)
        assert clients[client] == 6
        queues, clients = turn.out(lambda queue, template: queue != "qb")
        assert "qb" not in queues and client not in clients


def split_here(
    store: Store, client: str, queue: str | None, priority: int, children: int = 1
) -> tuple[int, RunState, Inline]:
    run_id, _ = store.runs.create(
        NewRun("t", f"test:{uuid.uuid4()}", {}, 2, queue, client=client, priority=priority)
    )
    inline = Inline("me:1", 30)
    plan = [{"i": i} for i in range(children)]
    state = store.runs.split(run_id, lambda run: plan, deferred=True, offer=inline)
    return run_id, state, inline


def test_a_one_child_run_nothing_competes_with_is_taken_by_its_master(store: Store) -> None:
    client = new_client(store)
    run_id, state, inline = split_here(store, client, None, HIGHEST_PRIORITY)
    assert state is RunState.RUNNING
    [(index, claim)] = inline.taken
    assert (index, claim.spec, claim.attempt, claim.fence) == (0, {"i": 0}, 0, 1)
    assert store.runs.status(run_id).state is RunState.RUNNING
    with store.dispatch.turn() as turn:  # the dispatcher never sends it
        assert turn is not None
        assert run_id not in {d.run_id for ds in turn.demands().values() for d in ds}
    refused = store.children.claim(run_id, 0, "other:2", 30)  # a stray copy: it is ours
    assert refused == Refusal(ClaimRefusal.BUSY)
    started = store.children.start(claim, 30)
    assert started is not None and started.attempt == 1
    assert store.runs.finish_alone(run_id, started, None, '"done"') == []
    status = store.runs.status(run_id)
    assert status.state is RunState.SUCCEEDED
    with pytest.raises(LeaseLost):  # once finished, the fence writes nothing more
        store.runs.finish_alone(run_id, started, None, None)


def test_the_dispatcher_decides_where_a_one_child_run_competes(store: Store) -> None:
    """A tier's queue, a client that caps its children running, a run of higher priority
    waiting in the default queue, a run of two: each is split for the dispatcher."""
    plain, capped = new_client(store), new_client(store)
    store.clients.save(Client(capped, max_running=3))
    waiting_run(store, plain, None, priority=HIGHEST_PRIORITY)
    for client, queue, priority, children in (
        (plain, "gpu", LOWEST_PRIORITY, 1),
        (capped, None, HIGHEST_PRIORITY, 1),
        (plain, None, HIGHEST_PRIORITY - 1, 1),
        (plain, None, HIGHEST_PRIORITY, 2),
    ):
        run_id, state, inline = split_here(store, client, queue, priority, children)
        assert (state, inline.taken) == (RunState.SPLITTING, []), (client, queue, priority)
        assert store.runs.status(run_id).state is RunState.SPLITTING
