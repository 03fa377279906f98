"""The dispatcher's store's contract (``store.dispatch``, DTASK_DISPATCH=window): one turn at
a time, children left unsent by a deferred split taken in index order and counted, what is out
per queue and client, the head of each client's runs in the order they are sent, a turn's takes
undone when it fails or is lost; and where a one-child run competes at all. Run on both stores
(conftest.py); the order children leave a pass in is test_dispatch_order.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest

from dtask.db import Finished, Refusal
from dtask.db.dispatch import Out
from dtask.db.inline import Inline
from dtask.db.recovery import Redispatch
from dtask.domain.clients import HIGHEST_PRIORITY, LOWEST_PRIORITY
from dtask.domain.runs import ClaimRefusal, NewRun, RunState
from dtask.exceptions import LeaseLost
from tests.contract.worlds import World


def indexes(messages: list[list[Redispatch]]) -> list[int]:
    """The children of the messages a take made, in the order they go."""
    return [c.index for m in messages for c in m]


def unsent(world: World, run_id: int) -> int:
    with world.turn() as turn:
        assert turn is not None
        return next(d.unsent for ds in turn.demands().values() for d in ds if d.run_id == run_id)


def test_deferred_children_are_taken_in_order_and_counted(world: World) -> None:
    run_id = world.waiting(5, max_attempts=1)
    assert unsent(world, run_id) == 5
    with world.turn() as turn:
        assert turn is not None
        before = turn.out()[0].get(None)
        assert indexes(turn.take(run_id, 3)) == [0, 1, 2]
        after = turn.out()[0][None]
        assert after.queued - (before.queued if before else 0) == 3
    assert unsent(world, run_id) == 2
    with world.turn() as turn:
        assert turn is not None
        assert indexes(turn.take(run_id, 10)) == [3, 4]
        assert run_id not in {d.run_id for ds in turn.demands().values() for d in ds}


def test_one_pass_at_a_time(world: World) -> None:
    with world.turn() as first:
        assert first is not None
        with world.dispatch.turn() as second:
            assert second is None


def test_a_turn_waited_for_is_had_once_the_holder_s_pass_ends(world: World) -> None:
    holding, got = threading.Event(), []

    def holder() -> None:
        with world.turn() as turn:
            assert turn is not None
            holding.set()
            time.sleep(0.3)

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait(10)
    with world.dispatch.turn(wait=0.05) as busy:
        got.append(busy is None)
    with world.dispatch.turn(wait=10) as mine:
        got.append(mine is not None)
    thread.join()
    assert got == [True, True]


def test_a_rerun_s_children_wait_for_the_dispatcher_again(world: World) -> None:
    run_id = world.waiting(2, max_attempts=1)
    with world.turn() as turn:
        assert turn is not None
        turn.take(run_id, 2)
    for index in (0, 1):
        world.children.fail_attempt(world.claim(run_id, index), "boom")  # failed for good
    assert world.runs.finalize(run_id) is RunState.FAILED
    assert world.runs.rerun(run_id) is RunState.SPLITTING
    world.runs.dispatch(run_id, lambda run, kids: None, deferred=True)
    assert unsent(world, run_id) == 2


def test_a_pass_reads_only_the_head_of_each_client_s_runs_in_the_order_it_sends(
    world: World,
) -> None:
    client, other, qa = world.client(), world.client(), world.queue()
    head = [
        # within priority 5 the one with a deadline goes first
        world.waiting(client=client, queue=qa, priority=p, delay_tolerance=300 if i == 4 else None)
        for i, p in enumerate((1, 9, 5, 5, 5, 1, 9, 0))
    ]
    u = [world.waiting(client=client, queue=qa, template="u") for _ in range(2)]
    default = world.waiting(client=client)
    theirs = [world.waiting(client=other, queue=qa) for _ in range(6)]
    with world.turn() as turn:
        assert turn is not None
        demands = turn.demands(per_client=4)
    qa_runs = [d.run_id for d in demands[qa] if d.client == client and d.template == "t"]
    assert qa_runs == [head[1], head[6], head[4], head[2]]  # priority, then deadline, then id
    assert [d.run_id for d in demands[qa] if d.template == "u" and d.client == client] == u
    assert [d.run_id for d in demands[qa] if d.client == other] == theirs[:4]
    assert default in {d.run_id for d in demands[None] if d.client == client}
    for queue, waiting in demands.items():  # never more than the head of any group
        groups = Counter((d.client, d.template) for d in waiting)
        assert max(groups.values()) <= 4, (queue, groups)


def test_a_demand_carries_what_the_plan_weighs(world: World) -> None:
    client, q = world.client(), world.queue()
    run_id = world.waiting(3, client=client, queue=q, priority=7, delay_tolerance=60)
    with world.turn() as turn:
        assert turn is not None
        [d] = turn.demands()[q]
    assert (d.run_id, d.client, d.priority, d.unsent, d.template, d.total) == (
        run_id, client, 7, 3, "t", 3,
    )  # fmt: skip
    assert d.deadline is not None and d.child_seconds is None
    assert d.deadline == world.runs.status(run_id).deadline


def test_what_is_out_is_counted_per_queue_and_client(world: World) -> None:
    client, qb = world.client(), world.queue()
    runs = [world.waiting(client=client, queue=qb) for _ in range(3)]
    with world.turn() as turn:
        assert turn is not None
        for run_id in runs:
            turn.take(run_id, 2)
    world.claim(runs[0], 0)
    with world.turn() as turn:
        assert turn is not None
        queues, clients = turn.out()
        assert queues[qb] == Out(queued=5, running=1)
        assert clients[client] == 6
        queues, clients = turn.out(lambda queue, template: queue != qb)
        assert qb not in queues and client not in clients


def test_what_is_out_counts_only_running_runs(world: World) -> None:
    client, q = world.client(), world.queue()
    kept, cancelled = world.waiting(client=client, queue=q), world.waiting(client=client, queue=q)
    with world.turn() as turn:
        assert turn is not None
        turn.take(kept, 1)
        turn.take(cancelled, 2)
    world.runs.cancel(cancelled)
    with world.turn() as turn:
        assert turn is not None
        queues, clients = turn.out()
    assert (queues[q], clients[client]) == (Out(queued=1, running=0), 1)
    assert cancelled not in world.demanded()


def test_a_cancelled_run_s_children_count_as_out_until_they_stop(world: World) -> None:
    """A cancel stops running children only at their next checkpoint: until then they hold
    their slots and their client's cap (a capped client ran twice its cap when they did not
    count); its queued messages will not run and do not count."""
    client, q = world.client(), world.queue()
    run_id = world.waiting(3, client=client, queue=q)
    with world.turn() as turn:
        assert turn is not None
        turn.take(run_id, 3)
    for index in (0, 1):
        assert not isinstance(world.children.claim(run_id, index, "me", 30), Refusal)
    world.runs.cancel(run_id)
    with world.turn() as turn:
        assert turn is not None
        queues, clients = turn.out()
    assert (queues[q], clients[client]) == (Out(queued=0, running=2), 2)


def test_shares_are_the_clients_limits_and_what_they_have_out(world: World) -> None:
    capped, weighted = world.client(max_running=3), world.client(weight=2.5)
    unknown = "no-such-client-row"
    with world.turn() as turn:
        assert turn is not None
        shares = turn.shares({capped, weighted, unknown}, {capped: 2})
    assert (shares[capped].weight, shares[capped].max_running) == (1.0, 3)
    assert (shares[capped].in_flight, shares[capped].room) == (2, 1)
    assert (shares[weighted].weight, shares[weighted].in_flight) == (2.5, 0)
    assert shares[unknown].max_running is None and shares[unknown].weight == 1.0


def test_the_unsent_count_goes_down_to_nothing_and_no_child_is_taken_twice(world: World) -> None:
    run_id = world.waiting(7)
    taken, counts = [], []
    for _ in range(5):  # bounded: a count that never goes down fails here, not by timeout
        if run_id not in world.demanded():
            break
        counts.append(unsent(world, run_id))
        with world.turn() as turn:
            assert turn is not None
            taken += indexes(turn.take(run_id, 3))
    assert counts == [7, 4, 1] and taken == list(range(7))
    with world.turn() as turn:
        assert turn is not None
        assert turn.take(run_id, 3) == []


def test_a_child_a_stray_message_claimed_is_not_taken_and_the_count_is_made_again(
    world: World,
) -> None:
    run_id = world.waiting(3)
    world.claim(run_id, 1)  # a message of an earlier dispatch (a rerun's) claimed it
    with world.turn() as turn:
        assert turn is not None
        assert indexes(turn.take(run_id, 3)) == [0, 2]
    assert run_id not in world.demanded()


def test_a_taken_child_carries_what_its_message_needs(world: World) -> None:
    q = world.queue()
    run_id = world.waiting(2, queue=q, template="u")
    with world.turn() as turn:
        assert turn is not None
        [[c]] = turn.take(run_id, 1)
    assert (c.run_id, c.index, c.spec, c.template, c.queue) == (run_id, 0, {"i": 0}, "u", q)
    assert c.group_id == world.runs.get(run_id).group_id == f"dtask-{run_id}-1"


def test_a_pass_that_fails_takes_nothing(world: World) -> None:
    run_id = world.waiting(3)
    with pytest.raises(RuntimeError), world.turn() as turn:
        assert turn is not None
        assert len(indexes(turn.take(run_id, 2))) == 2
        raise RuntimeError("the broker went away mid-pass")
    assert unsent(world, run_id) == 3
    with world.turn() as turn:
        assert turn is not None
        assert indexes(turn.take(run_id, 3)) == [0, 1, 2]


def test_a_turn_held_idle_past_its_limit_is_lost_and_what_it_took_is_undone(
    world: World,
) -> None:
    run_id = world.waiting(3)
    with pytest.raises(LeaseLost, match="turn ended"), world.dispatch.turn(0.3, 10) as late:
        assert late is not None
        assert indexes(late.take(run_id, 2)) == [0, 1]
        time.sleep(1.0)  # the holder hangs, idle in its turn
        with world.turn() as other:  # another worker's pass takes over
            assert other is not None
            assert indexes(other.take(run_id, 3)) == [0, 1, 2]
        late.take(run_id, 1)
    assert run_id not in world.demanded()


def split_here(
    world: World, client: str, queue: str | None, priority: int, children: int = 1
) -> tuple[int, RunState, Inline]:
    run_id, _ = world.runs.create(
        NewRun("t", f"contract:{uuid.uuid4()}", {}, 2, queue, client=client,
               priority=priority),
    )  # fmt: skip
    inline = Inline("me:1", 30)
    plan = [{"i": i} for i in range(children)]
    state = world.runs.split(run_id, lambda run, slots: plan, deferred=True, offer=inline)
    return run_id, state, inline


def test_a_one_child_run_nothing_competes_with_is_taken_by_its_master(world: World) -> None:
    client = world.client()
    run_id, state, inline = split_here(world, client, None, HIGHEST_PRIORITY)
    assert state is RunState.RUNNING
    [(index, claim)] = inline.taken
    assert (index, claim.spec, claim.attempt, claim.fence) == (0, {"i": 0}, 0, 1)
    assert world.runs.status(run_id).state is RunState.RUNNING
    assert run_id not in world.demanded()  # the dispatcher never sends it
    refused = world.children.claim(run_id, 0, "other:2", 30)  # a stray copy: it is ours
    assert refused == Refusal(ClaimRefusal.BUSY)
    started = world.children.start(claim, 30)
    assert started is not None and started.attempt == 1
    assert world.runs.finish_alone(run_id, Finished(started, None, '"done"', "said")) == []
    assert world.output(run_id, 0) == "said"
    status = world.runs.status(run_id)
    assert status.state is RunState.SUCCEEDED
    with pytest.raises(LeaseLost):  # once finished, the fence writes nothing more
        world.runs.finish_alone(run_id, Finished(started, None, None))


def test_the_dispatcher_decides_where_a_one_child_run_competes(world: World) -> None:
    """A tier's queue, a client that caps its children running, a run of higher priority
    waiting in the default queue, a run of two: each is split for the dispatcher."""
    plain, capped = world.client(), world.client(max_running=3)
    world.waiting(client=plain, priority=HIGHEST_PRIORITY)
    for client, queue, priority, children in (
        (plain, "gpu", LOWEST_PRIORITY, 1),
        (capped, None, HIGHEST_PRIORITY, 1),
        (plain, None, HIGHEST_PRIORITY - 1, 1),
        (plain, None, HIGHEST_PRIORITY, 2),
    ):
        run_id, state, inline = split_here(world, client, queue, priority, children)
        assert (state, inline.taken) == (RunState.SPLITTING, []), (client, queue, priority)
        assert world.runs.status(run_id).state is RunState.SPLITTING


def test_a_lone_child_s_success_releases_what_waits_for_its_run(world: World) -> None:
    run_id, state, inline = split_here(world, world.client(), None, HIGHEST_PRIORITY)
    assert state is RunState.RUNNING
    down = world.submit(after=(run_id,))
    [(_, claim)] = inline.taken
    started = world.children.start(claim, 30)
    assert started is not None
    assert world.runs.finish_alone(run_id, Finished(started, None, None)) == [down]
    assert world.state(down) is RunState.PENDING


def test_a_run_s_first_child_time_says_whether_children_wait_to_be_sized(world: World) -> None:
    """``note_time`` is True once: at a run's first measured time while children of it wait
    unsent (the worker then passes at once: received.note_time)."""
    waiting, sent = world.waiting(5), world.waiting(2)
    with world.turn() as turn:
        assert turn is not None
        assert len(indexes(turn.take(sent, 2))) == 2
    assert world.children.note_time(waiting, 0.002) is True
    assert world.children.note_time(waiting, 0.004) is False  # measured already
    assert world.children.note_time(sent, 0.002) is False  # nothing waits
    with world.turn() as turn:
        assert turn is not None
        [d] = [d for ds in turn.demands().values() for d in ds if d.run_id == waiting]
    assert d.child_seconds is not None and abs(d.child_seconds - 0.0026) < 1e-9
