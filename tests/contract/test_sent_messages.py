"""A message of several children is sent as one row (``dtask_messages``), its children not
written (issue 59): the dispatcher's take marks the run's children below a mark as taken, a
worker's claim of the message marks it taken, and until then its children count as queued.
A lone child is still sent by its own row. Run on both stores (conftest.py)."""

from __future__ import annotations

import pytest

from dtask.db.dispatch import Out
from dtask.domain.runs import RunState
from tests.contract.worlds import World


def take(world: World, run_id: int, count: int, batch: int) -> list[list[int]]:
    with world.turn() as turn:
        assert turn is not None
        return [[c.index for c in m] for m in turn.take(run_id, count, batch)]


def test_a_message_of_several_children_leaves_their_rows_unwritten(world: World) -> None:
    q = world.queue()
    run = world.waiting(7, client=world.client(), queue=q)
    assert take(world, run, 7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert [world.sent(run, i) for i in range(7)] == [False] * 6 + [True]  # the lone one is
    assert world.out(q) == Out(queued=7, running=0)
    assert take(world, run, 7, 3) == []  # below the mark: taken, written or not
    assert run not in world.demanded()  # and not counted again as waiting


def test_the_next_take_starts_past_the_last_message(world: World) -> None:
    run = world.waiting(10)
    assert take(world, run, 4, 4) == [[0, 1, 2, 3]]
    assert take(world, run, 4, 2) == [[4, 5], [6, 7]]
    assert take(world, run, 4, 4) == [[8, 9]]


def test_a_message_a_worker_took_is_running_not_queued(world: World) -> None:
    q = world.queue()
    run = world.waiting(6, client=world.client(), queue=q)
    assert take(world, run, 6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert sorted(world.message(run, [0, 1, 2])) == [0, 1, 2]
    assert world.out(q) == Out(queued=3, running=3)
    assert world.message(run, [0, 1, 2], "a copy") == {}  # a redelivered copy: still 3 and 3
    assert world.out(q) == Out(queued=3, running=3)
    assert sorted(world.message(run, [3, 4, 5])) == [3, 4, 5]
    assert world.out(q) == Out(queued=0, running=6)


def test_a_pass_that_fails_leaves_no_message(world: World) -> None:
    q = world.queue()
    run = world.waiting(4, client=world.client(), queue=q)
    with pytest.raises(RuntimeError), world.turn() as turn:
        assert turn is not None
        assert len(turn.take(run, 4, 4)) == 1
        raise RuntimeError("the broker went away mid-pass")
    assert world.out(q) is None
    assert take(world, run, 4, 4) == [[0, 1, 2, 3]]
    assert world.out(q) == Out(queued=4, running=0)


def test_a_rerun_forgets_its_messages_and_sends_its_children_again(world: World) -> None:
    q = world.queue()
    run = world.waiting(4, client=world.client(), queue=q)
    assert take(world, run, 4, 4) == [[0, 1, 2, 3]]  # lost in the broker, say
    assert world.runs.cancel(run) is RunState.CANCELLED
    assert world.runs.rerun(run) is RunState.SPLITTING
    assert world.runs.dispatch(run, lambda r, kids: None, deferred=True) is RunState.RUNNING
    assert run in world.demanded()
    assert world.out(q) is None  # the lost message is not counted
    assert take(world, run, 4, 2) == [[0, 1], [2, 3]]
    assert world.out(q) == Out(queued=4, running=0)
