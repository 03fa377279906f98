"""The backlog caps' rule (dtask/domain/backlog.py): a lone client gets the whole queue cap, a
full queue refuses the clients holding their share of it and admits one below its share, and
no sequence of submits by any number of clients takes a queue past twice its cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.backlog import CEILING, Backlog, Cap, room, share


def test_no_cap_admits_everything() -> None:
    assert room(Backlog(10**6, 50, 10**6, 10**6), None, None, 7) == (7, None)


def test_a_lone_client_gets_the_whole_cap_and_no_more() -> None:
    assert room(Backlog(0, 0, 0, 0), 3, None, 5) == (3, Cap.QUEUE)
    assert room(Backlog(3, 0, 3, 3), 3, None, 1) == (0, Cap.QUEUE)


def test_a_full_queue_refuses_its_filler_and_admits_another_client_its_share() -> None:
    assert room(Backlog(10, 0, 10, 10), 10, None, 1) == (0, Cap.QUEUE)
    assert room(Backlog(10, 1, 0, 0), 10, None, 8) == (5, Cap.QUEUE)  # half the cap
    assert room(Backlog(10, 1, 10, 10), 10, None, 1) == (0, Cap.QUEUE)  # the filler still not


def test_the_client_cap_holds_whatever_the_queue() -> None:
    assert room(Backlog(0, 0, 0, 4), 3, 4, 1) == (0, Cap.CLIENT)
    assert room(Backlog(0, 0, 0, 2), None, 4, 5) == (2, Cap.CLIENT)


def test_past_twice_the_cap_every_submit_is_refused() -> None:
    assert room(Backlog(2 * 3, 9, 0, 0), 3, None, 1) == (0, Cap.CEILING)


@given(st.integers(1, 1000), st.integers(0, 10_000))
def test_a_share_is_at_least_one_run_and_the_shares_fit_the_cap(cap: int, others: int) -> None:
    each = share(cap, others)
    assert each >= 1
    assert each * (others + 1) <= cap or each == 1


@given(
    cap=st.integers(1, 50),
    submits=st.lists(st.tuples(st.integers(0, 9), st.integers(1, 20)), max_size=80),
)
def test_no_submits_take_a_queue_past_twice_its_cap(
    cap: int, submits: list[tuple[int, int]]
) -> None:
    """Ten clients submit batches in any order. The queue never passes CEILING times its cap;
    a client refused by the queue's cap holds at least its share; and a client holding
    nothing is refused only once the queue is at the ceiling."""
    held = [0] * 10
    for who, wanted in submits:
        others = sum(1 for i, n in enumerate(held) if n and i != who)
        seen = Backlog(sum(held), others, held[who], held[who])
        fits, cap_hit = room(seen, cap, None, wanted)
        assert 0 <= fits <= wanted and (cap_hit is None) == (fits == wanted)
        after = seen.added(fits)
        if cap_hit is Cap.QUEUE:
            assert after.mine >= share(cap, others) and after.queue >= cap
        if cap_hit is not None and held[who] == 0 and fits == 0:
            assert cap_hit is Cap.CEILING
        held[who] += fits
        assert sum(held) <= CEILING * cap


@given(cap=st.integers(1, 1000), fillers=st.integers(1, 20))
def test_one_client_filling_the_queue_never_makes_another_busy(cap: int, fillers: int) -> None:
    """However the queue's cap is held (by one client, or ``fillers`` of them), a client
    that holds nothing gets its share: at least one run."""
    fits, _ = room(Backlog(cap, fillers, 0, 0), cap, None, cap)
    assert fits == share(cap, fillers) >= 1
