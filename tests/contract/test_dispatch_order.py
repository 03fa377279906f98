"""The order children leave the dispatcher in, its real pass (dtask/worker/dispatcher.py) over
each store (conftest.py): priority, then deadline (none last), then fair share between clients
by weight, a client never past its max_running (across its queues), a run's tier deciding the
queue and so the workers it waits for, each queue's window from its live slots, a template no
live worker knows holding none of its queue back, a small run's first child ahead of a full
window; every child sent once. The same rules with real workers: tests/acceptance/
test_dispatcher.py."""

from __future__ import annotations

from collections import Counter

from dtask.domain.clients import Tier
from dtask.domain.dispatch import SMALL_RUN_CHILDREN
from dtask.domain.runs import RunState
from dtask.domain.tiers import served_queues
from tests.contract.dispatching import Dispatching
from tests.contract.worlds import World

LARGE = SMALL_RUN_CHILDREN + 1  # no first child ahead of the window for a run this size


def test_children_leave_by_priority_then_deadline_none_last(
    world: World, dispatching: Dispatching
) -> None:
    client, q = world.client(), world.queue()
    dispatching.worker(q, slots=1)  # a window of two
    # created in the reverse of the order they go in: the id decides nothing here
    low = world.waiting(client=client, queue=q, priority=2)
    none = world.waiting(client=client, queue=q, priority=7)
    late = world.waiting(client=client, queue=q, priority=7, delay_tolerance=600)
    soon = world.waiting(client=client, queue=q, priority=7, delay_tolerance=60)
    top = world.waiting(client=client, queue=q, priority=9)
    rounds = dispatching.until_done()
    # the first pass also sends the best waiting newcomer's first child ahead of the window
    assert rounds[0] == [(top, 0), (top, 1), (soon, 0)]
    order = [run for sent in rounds for run, _ in sent]
    assert order == [top, top, soon, soon, late, late, none, none, low, low]
    assert all(world.state(r) is RunState.RUNNING for r in (low, none, late, soon, top))


def test_a_higher_priority_run_overtakes_a_backlog_at_the_next_free_place(
    world: World, dispatching: Dispatching
) -> None:
    client, q = world.client(), world.queue()
    dispatching.worker(q, slots=2)  # a window of four
    backlog = world.waiting(LARGE, client=client, queue=q, priority=2)
    assert dispatching.once() == [(backlog, i) for i in range(4)]
    urgent = world.waiting(LARGE, client=client, queue=q, priority=9)
    assert dispatching.once() == []  # the window is full
    dispatching.work(3)
    assert dispatching.once() == [(urgent, 0), (urgent, 1), (urgent, 2)]
    levels = {p.run_id: p.level for p in dispatching.sent}
    assert levels[urgent] < levels[backlog]  # and ahead of it in the broker too


def test_two_clients_share_the_window_by_their_weights(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    a, b, heavy = world.client(), world.client(), world.client(weight=3)
    dispatching.worker(q, slots=2)
    ra, rb = world.waiting(12, client=a, queue=q), world.waiting(12, client=b, queue=q)
    assert dispatching.once() == [(ra, 0), (ra, 1), (rb, 0), (rb, 1)]  # a pass sends by run
    dispatching.work()
    assert Counter(run for run, _ in dispatching.once()) == {ra: 2, rb: 2}
    dispatching.work()
    rh = world.waiting(LARGE, client=heavy, queue=q)
    got: Counter[int] = Counter()
    for _ in range(4):
        got.update(run for run, _ in dispatching.once())
        dispatching.work()
    assert got == {rh: 10, ra: 3, rb: 3}, got  # 3 : 1 : 1 while all three wait


def test_a_client_that_comes_later_is_not_starved_by_the_others_past(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    early, later = world.client(), world.client()
    dispatching.worker(q, slots=2)
    first = world.waiting(LARGE, client=early, queue=q)
    for _ in range(5):
        dispatching.once()
        dispatching.work()
    second = world.waiting(LARGE, client=later, queue=q)
    got = Counter(run for run, _ in dispatching.once())
    assert got == {first: 2, second: 2}


def test_a_client_never_has_more_than_its_max_running_out(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    capped, free = world.client(max_running=2), world.client()
    dispatching.worker(q, slots=3)  # a window of six
    rc, rf = world.waiting(10, client=capped, queue=q), world.waiting(10, client=free, queue=q)
    assert Counter(run for run, _ in dispatching.once()) == {rc: 2, rf: 4}
    dispatching.work(finish=False)  # all six running: the window is free, the cap is not
    assert Counter(run for run, _ in dispatching.once()) == {rf: 6}
    dispatching.work(finish=False)
    assert dispatching.once() == []
    dispatching.finish_one(rc)  # one of the capped client's children ends
    assert [run for run, _ in dispatching.once()] == [rc]


def test_a_client_s_cap_counts_its_children_in_every_queue(
    world: World, dispatching: Dispatching
) -> None:
    q1, q2 = world.queue(), world.queue()
    capped = world.client(max_running=3)
    dispatching.worker(q1, q2, slots=2)  # a window of four in each
    r1, r2 = world.waiting(5, client=capped, queue=q1), world.waiting(5, client=capped, queue=q2)
    assert len(dispatching.once()) == 3
    dispatching.work(finish=False)
    assert dispatching.once() == []
    assert {p.run_id for p in dispatching.sent} <= {r1, r2}


def test_a_run_s_tier_decides_the_queue_and_the_workers_it_waits_for(
    world: World, dispatching: Dispatching
) -> None:
    base = world.queue()
    plain, limited = world.client(), world.client(tier=Tier.BASIC)
    regular = world.waiting(3, client=plain, queue=base, tier=Tier.REGULAR)
    capped = world.waiting(3, client=limited, queue=base, tier=Tier.PREMIUM)  # capped at basic
    basic = world.waiting(3, client=plain, queue=base)
    assert world.runs.get(regular).queue == f"{base}.regular"
    assert (world.runs.get(capped).queue, world.runs.status(capped).tier) == (base, Tier.BASIC)
    dispatching.worker(*served_queues([base], Tier.BASIC), slots=2)
    assert {run for run, _ in dispatching.until_done()[0]} == {capped, basic}
    assert {run for sent in dispatching.until_done() for run, _ in sent} == set()
    dispatching.worker(*served_queues([base], Tier.REGULAR), slots=1)
    assert [run for sent in dispatching.until_done() for run, _ in sent] == [regular] * 3


def test_a_queue_holds_two_children_per_live_slot_and_none_without_a_worker(
    world: World, dispatching: Dispatching
) -> None:
    served, unserved = world.queue(), world.queue()
    dispatching.worker(served, slots=3)
    here = world.waiting(LARGE, queue=served)
    there = world.waiting(LARGE, queue=unserved)
    assert dispatching.once() == [(here, i) for i in range(6)]
    assert dispatching.once() == []
    dispatching.work(2)
    assert dispatching.once() == [(here, 6), (here, 7)]
    assert there not in {p.run_id for p in dispatching.sent}


def test_a_template_no_live_worker_knows_holds_none_of_its_queue_back(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    dispatching.worker(q, slots=2, templates=["t"])
    unknown = world.waiting(LARGE, queue=q, template="gone", priority=9)
    known = world.waiting(LARGE, queue=q)
    assert dispatching.once() == [(known, i) for i in range(4)]
    dispatching.worker(q, slots=1)  # a worker that did not say what it knows: it may
    assert [run for run, _ in dispatching.once()] == [unknown, unknown]


def test_a_small_run_s_first_child_leaves_although_the_window_is_full(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    dispatching.worker(q, slots=1)
    large = world.waiting(LARGE, queue=q)
    assert dispatching.once() == [(large, 0), (large, 1)]
    small = world.waiting(3, queue=q)
    assert dispatching.once() == [(small, 0)]  # its first child, not the rest
    assert dispatching.once() == []
    levels = {p.run_id: p.level for p in dispatching.sent}
    assert levels[small] < levels[large]


def test_every_child_of_many_runs_is_sent_exactly_once(
    world: World, dispatching: Dispatching
) -> None:
    q = world.queue()
    a, b = world.client(), world.client(max_running=4)
    dispatching.worker(q, slots=3)
    sizes = {world.waiting(n, client=c, queue=q): n for n, c in ((7, a), (11, b), (5, a), (9, b))}
    rounds = dispatching.until_done()
    sent = [child for r in rounds for child in r]
    assert sorted(sent) == sorted((r, i) for r, n in sizes.items() for i in range(n))
    assert all(len(r) <= 6 + 3 for r in rounds)  # the window, and one lane child per slot
