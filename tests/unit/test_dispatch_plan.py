"""The dispatch rule (dtask/domain/dispatch.py): properties over random demand."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.dispatch import (
    BATCH_SECONDS,
    MAX_BATCH,
    Demand,
    Passes,
    Share,
    batch_size,
    plan,
    plan_with_newcomers,
    runnable,
    window,
)

T0 = datetime(2026, 11, 23, tzinfo=UTC)

demands = st.lists(
    st.builds(
        Demand,
        run_id=st.integers(1, 10_000),
        client=st.sampled_from(["a", "b", "c"]),
        priority=st.integers(0, 9),
        deadline=st.one_of(st.none(), st.integers(0, 100).map(lambda s: T0 + timedelta(s))),
        unsent=st.integers(0, 50),
    ),
    max_size=12,
    unique_by=lambda d: d.run_id,
)
shares = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.builds(
        Share,
        weight=st.floats(0.1, 10),
        max_running=st.one_of(st.none(), st.integers(1, 20)),
        in_flight=st.integers(0, 25),
    ),
)


@given(demands, shares, st.integers(0, 120))
def test_a_plan_is_bounded_and_conserves_work(
    runs: list[Demand], share: dict[str, Share], free: int
) -> None:
    sent = plan(runs, share, free, Passes())
    by_id = {d.run_id: d for d in runs}
    assert sum(sent.values()) <= free
    assert all(0 < n <= by_id[r].unsent for r, n in sent.items())
    per_client = Counter[str]()
    for r, n in sent.items():
        per_client[by_id[r].client] += n
    for client, n in per_client.items():
        assert n <= share.get(client, Share()).room
    sendable = sum(
        min(share.get(c, Share()).room, sum(d.unsent for d in runs if d.client == c))
        for c in {d.client for d in runs}
    )
    assert sum(sent.values()) == min(free, sendable)  # nothing held back while room is left


@given(demands, shares, st.integers(1, 120))
def test_lower_priority_waits_while_higher_priority_can_go(
    runs: list[Demand], share: dict[str, Share], free: int
) -> None:
    sent = plan(runs, share, free, Passes())
    per_client = Counter[str]()
    for d in runs:
        per_client[d.client] += sent.get(d.run_id, 0)
    for high in runs:
        starved = sent.get(high.run_id, 0) < high.unsent
        has_room = per_client[high.client] < share.get(high.client, Share()).room
        if starved and has_room:  # it could have had more: nobody below it got any
            assert not any(sent.get(low.run_id) for low in runs if low.priority < high.priority), (
                high,
                sent,
            )


def test_within_a_priority_earliest_deadline_first() -> None:
    late = Demand(1, "a", 5, T0 + timedelta(seconds=60), 10)
    soon = Demand(2, "b", 5, T0 + timedelta(seconds=5), 10)
    none = Demand(3, "c", 5, None, 10)
    assert plan([late, soon, none], {}, 12, Passes()) == {2: 10, 1: 2}


@given(st.floats(0.2, 5), st.integers(50, 400))
def test_clients_share_by_weight_over_many_plans(weight_b: float, rounds: int) -> None:
    runs = [Demand(1, "a", 5, None, 10_000), Demand(2, "b", 5, None, 10_000)]
    share = {"a": Share(weight=1.0), "b": Share(weight=weight_b)}
    passes = Passes()
    got = Counter[int]()
    for _ in range(rounds):
        got.update(plan(runs, share, 1, passes))
    expected_b = rounds * weight_b / (1 + weight_b)
    assert abs(got[2] - expected_b) <= 1.5


def test_a_client_that_arrives_late_is_not_owed_the_past() -> None:
    passes = Passes()
    first = [Demand(1, "a", 5, None, 10_000)]
    for _ in range(100):
        plan(first, {}, 1, passes)  # client a alone for a while
    both = [*first, Demand(2, "b", 5, None, 10_000)]
    got = Counter[int]()
    for _ in range(100):
        got.update(plan(both, {}, 1, passes))
    assert abs(got[1] - got[2]) <= 1  # half each from now on, not b until it catches up


def test_runs_of_one_client_share_its_part() -> None:
    runs = [Demand(1, "a", 5, None, 100), Demand(2, "a", 5, None, 100)]
    passes = Passes()
    got = Counter[int]()
    for _ in range(40):
        got.update(plan(runs, {}, 1, passes))
    assert got == {1: 20, 2: 20}


def test_the_window_follows_the_slots_and_the_pace() -> None:
    assert window(0, 500.0, 0.05, None) == 0  # nobody consumes: nothing is sent
    assert window(2, 0.0, 0.05, None) == 4  # slow children: one running and one next per slot
    assert window(2, 400.0, 0.05, None) == 44  # fast ones: plus two passes' worth
    assert window(2, 400.0, 0.05, 7) == 7


def test_a_batch_of_short_children_fills_the_window_per_slot() -> None:
    assert window(2, 0.0, 0.05, None, batch=25) == 100  # two messages of 25 per slot
    assert window(2, 400.0, 0.05, 7, batch=25) == 7


@given(st.one_of(st.none(), st.floats(0.0, 100.0)))
def test_children_go_several_to_a_message_only_as_many_as_fill_the_batch_time(
    seconds: float | None,
) -> None:
    size = batch_size(seconds)
    assert 1 <= size <= MAX_BATCH
    if seconds is None or seconds >= BATCH_SECONDS:
        assert size == 1  # unmeasured, or long: a message of its own
    elif size > 1:
        assert size * seconds <= BATCH_SECONDS * 1.0001  # no child waits past the batch time
        assert size == MAX_BATCH or (size + 1) * seconds > BATCH_SECONDS * 0.9999


def test_the_batch_shrinks_as_children_grow() -> None:
    sizes = [batch_size(s) for s in (0.0, 0.0001, 0.001, 0.01, 0.03, 0.05, 1.0)]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == MAX_BATCH and sizes[-1] == 1


_names = st.sampled_from(["a", "b", "c"])
_known = st.lists(st.none() | st.lists(_names).map(tuple), max_size=4)


@given(_names, _known)
def test_a_template_is_runnable_unless_every_live_worker_says_it_does_not_know_it(
    template: str, known: list[tuple[str, ...] | None]
) -> None:
    refused = bool(known) and all(k is not None and template not in k for k in known)
    assert runnable(template, known) is not refused


def test_a_queue_without_live_workers_keeps_its_runs() -> None:
    assert runnable("a", [])
    assert not runnable("a", [("b",), ()])
    assert runnable("a", [("b",), None])


@given(demands, shares, st.integers(-60, 120), st.integers(0, 8), st.sets(st.integers(1, 10_000)))
def test_newcomers_get_one_child_past_a_full_window_and_no_more(
    runs: list[Demand], share: dict[str, Share], free: int, overrun: int, known: set[int]
) -> None:
    """A run the dispatcher has sent nothing yet gets its first child even when the window
    is full, ``overrun`` such children a pass at most."""
    alone = plan(runs, share, free, Passes(runs=dict.fromkeys(known, 0.0)))
    sent = plan_with_newcomers(runs, share, free, overrun, Passes(runs=dict.fromkeys(known, 0.0)))
    by_id = {d.run_id: d for d in runs}
    assert sum(sent.values()) <= max(0, free) + overrun
    assert all(0 < n <= by_id[r].unsent for r, n in sent.items())
    for run_id, n in sent.items():
        extra = n - alone.get(run_id, 0)
        assert extra == 0 or (extra == 1 and run_id not in known and run_id not in alone)
    per_client = Counter[str]()
    for r, n in sent.items():
        per_client[by_id[r].client] += n
    for client, n in per_client.items():
        assert n <= share.get(client, Share()).room


def test_a_new_run_gets_its_first_child_while_a_large_one_fills_the_window() -> None:
    large = Demand(1, "a", 5, None, 90_000)
    new = Demand(2, "a", 5, None, 1)
    known = Passes(runs={1: 40.0})
    assert plan([large, new], {}, 0, Passes(runs={1: 40.0})) == {}
    assert plan_with_newcomers([large, new], {}, 0, 2, known) == {2: 1}
    assert plan_with_newcomers([large, new], {}, -300, 2, Passes(runs={1: 40.0})) == {2: 1}
    assert plan_with_newcomers([large, new], {}, -300, 0, Passes(runs={1: 40.0})) == {}
    big_new = Demand(3, "b", 5, None, 500, total=500)  # large runs share the window only
    assert plan_with_newcomers([large, big_new], {}, 0, 2, Passes(runs={1: 40.0})) == {}
