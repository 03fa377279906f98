"""Straggler stealing's child side (dtask/db/steals.py ``give_away`` through
``store.children``): a checkpoint says when the child is asked to give work away; the cut
shrinks its range under its fence and adds the rest as a new child of the same run, counted
in its chord, or changes nothing. Run on both stores (conftest.py)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from dtask import services
from dtask.domain.runs import ChildState, NewRun, RunState
from dtask.exceptions import LeaseLost
from tests.contract.worlds import World

KEYS = ("a", "b")


def ranges(world: World, *bounds: tuple[int, int]) -> int:
    """A dispatched run whose children hold the ranges ``bounds``."""
    specs = [{"a": a, "b": b, "tag": "x"} for a, b in bounds]
    if world.name == "memory":
        run_id = world.runs.add("t", specs, 2, None, {})  # type: ignore[attr-defined]
    else:
        new = NewRun("t", f"contract:{uuid.uuid4()}", {}, 2, None)
        run_id, _ = world.runs.create(new)
        assert world.runs.split(run_id, lambda run, slots: specs) is RunState.SPLITTING
    assert world.runs.dispatch(run_id, lambda run, sent: None) is RunState.RUNNING
    return run_id


def ask(world: World, run_id: int, index: int) -> None:
    if world.name == "memory":
        rows = world.children.t.children.values()  # type: ignore[attr-defined]
        next(r for r in rows if (r.run_id, r.index) == (run_id, index)).give_away = True
    else:
        assert services.store().steals.ask(run_id, index)


def spec(world: World, run_id: int, index: int) -> dict[str, object]:
    if world.name == "memory":
        rows = world.children.t.children.values()  # type: ignore[attr-defined]
        return dict(next(r for r in rows if (r.run_id, r.index) == (run_id, index)).spec)
    with services.store().engine.connect() as conn:
        found = conn.execute(
            text("SELECT spec FROM dtask_children WHERE run_id = :r AND index = :i"),
            {"r": run_id, "i": index},
        ).scalar_one()
    return dict(found)


def test_a_checkpoint_says_when_the_child_is_asked_to_give_work_away(world: World) -> None:
    run_id = ranges(world, (1, 100), (101, 200))
    mine = world.claim(run_id, 0)
    assert world.children.checkpoint(mine, {"done": 5}, 30) is False
    ask(world, run_id, 0)
    assert world.children.checkpoint(mine, {"done": 10}, 30) is True
    gift = world.children.give_away(mine, run_id, KEYS, 100, 56, deferred=True)
    assert gift is not None
    assert world.children.checkpoint(mine, {"done": 12}, 30) is False  # answered


@pytest.mark.parametrize("deferred", [True, False])
def test_the_rest_goes_to_a_new_child_of_the_same_run_and_chord(
    world: World, deferred: bool
) -> None:
    run_id = ranges(world, (1, 100), (101, 200))
    before = world.runs.get(run_id)
    mine = world.claim(run_id, 0)
    world.children.checkpoint(mine, {"done": 10}, 30)
    gift = world.children.give_away(mine, run_id, KEYS, 100, 56, deferred)
    assert gift is not None
    assert (gift.index, gift.spec, gift.template) == (2, {"a": 56, "b": 100, "tag": "x"}, "t")
    assert spec(world, run_id, 0) == {"a": 1, "b": 55, "tag": "x"}
    assert spec(world, run_id, 2) == {"a": 56, "b": 100, "tag": "x"}
    after = world.runs.get(run_id)
    assert (after.child_total, after.chord_size) == (3, (before.chord_size or 0) + 1)
    assert gift.chord_size == after.chord_size
    assert world.seen(run_id, 2) == (ChildState.PENDING, 0, None, None)
    assert world.seen(run_id, 0)[:3] == (ChildState.RUNNING, 1, "me")  # it goes on
    taken = world.claim(run_id, 2, "thief")
    assert taken.spec == {"a": 56, "b": 100, "tag": "x"}
    world.children.finish(mine, None)
    world.children.finish(taken, None)
    world.children.finish(world.claim(run_id, 1), None)
    assert world.runs.finalize(run_id) is RunState.SUCCEEDED
    assert world.runs.status(run_id).children.total == 3


def test_a_stale_owner_or_a_changed_range_cuts_nothing(world: World) -> None:
    run_id = ranges(world, (1, 100))
    mine = world.claim(run_id, 0)
    with pytest.raises(LeaseLost):
        world.children.give_away(mine, run_id, KEYS, 99, 50, deferred=True)  # not its end
    with pytest.raises(LeaseLost):
        world.children.give_away(mine, run_id, KEYS, 100, 1, deferred=True)  # not past a
    world.take_over(run_id, 0)
    with pytest.raises(LeaseLost):
        world.children.give_away(mine, run_id, KEYS, 100, 50, deferred=True)
    assert world.runs.get(run_id).child_total == 1
    assert spec(world, run_id, 0) == {"a": 1, "b": 100, "tag": "x"}


def test_a_run_no_longer_running_gets_no_new_child(world: World) -> None:
    run_id = ranges(world, (1, 100))
    mine = world.claim(run_id, 0)
    world.force(run_id, RunState.CANCELLED)
    assert world.children.give_away(mine, run_id, KEYS, 100, 50, deferred=True) is None
    assert world.runs.get(run_id).child_total == 1
    assert spec(world, run_id, 0) == {"a": 1, "b": 100, "tag": "x"}
