"""The child store's contract for a message of children (``dtask.children``): taken together
(``claim_many``), a first take's attempt counted only as it ends, a re-take's as it starts,
successes written together (``write_batch``), unstarted ones handed back (``unclaim``). Run on
both stores (conftest.py)."""

from __future__ import annotations

import json
import time

import pytest

from dtask.db import Claim, Finished
from dtask.domain.runs import ChildState, ClaimRefusal, RunState
from dtask.exceptions import LeaseLost
from tests.contract.worlds import World


def taken(world: World, run: int, indexes: list[int], ttl: float = 30) -> dict[int, Claim]:
    return world.children.claim_many(run, indexes, "batch", ttl)


def test_claim_many_takes_each_child_under_its_own_fence_uncounted(world: World) -> None:
    run = world.run(children=3, max_attempts=2)
    claims = taken(world, run, [0, 1, 2])
    assert sorted(claims) == [0, 1, 2]
    for index, c in claims.items():
        assert (c.fence, c.attempt, c.counted, c.uncounted, c.spec) == (
            1,
            1,
            False,
            1,
            {"i": index},
        )
        assert world.seen(run, index)[:3] == (ChildState.RUNNING, 1, "batch")
    assert len({c.child_id for c in claims.values()}) == 3


def test_claim_many_leaves_held_finished_and_missing_children(world: World) -> None:
    run = world.run(children=3)
    world.claim(run, 0)
    world.children.finish(world.claim(run, 1), None)
    assert sorted(taken(world, run, [0, 1, 2, 7])) == [2]
    assert world.seen(run, 0)[2] == "me"


def test_claim_many_takes_nothing_in_a_cancelled_run(world: World) -> None:
    run = world.run(children=2)
    world.runs.cancel(run)
    assert taken(world, run, [0, 1]) == {}
    assert world.seen(run, 0)[:2] == (ChildState.PENDING, 0)


def test_start_counts_the_attempt_and_renews_the_lease(world: World) -> None:
    run = world.run()
    first = taken(world, run, [0], ttl=0.2)[0]
    started = world.children.start(first, 30)
    assert started is not None and (started.attempt, started.counted) == (1, True)
    time.sleep(0.3)
    assert world.refusal(run).reason is ClaimRefusal.BUSY
    world.children.release(started, None)
    assert world.seen(run)[:2] == (ChildState.PENDING, 0)


@pytest.mark.parametrize("hand_back", ["release", "unclaim"])
def test_a_first_take_handed_back_spends_no_attempt(world: World, hand_back: str) -> None:
    run = world.run()
    c = taken(world, run, [0])[0]
    if hand_back == "release":
        world.children.release(c, None)
    else:
        world.children.unclaim(c)
    assert world.seen(run)[:3] == (ChildState.PENDING, 0, None)


def test_a_first_take_s_success_counts_its_attempt(world: World) -> None:
    run = world.run()
    world.children.finish(taken(world, run, [0])[0], {"done": 1}, json.dumps(7))
    assert world.seen(run) == (ChildState.SUCCEEDED, 1, None, {"done": 1})


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_first_take_s_failure_counts_its_attempt(world: World, attempts: int) -> None:
    run = world.run(max_attempts=attempts)
    ends = world.children.fail_attempt(taken(world, run, [0])[0], "boom")
    last = attempts == 1
    assert ends is (ChildState.FAILED if last else ChildState.PENDING)
    assert world.seen(run)[:3] == (ends, 1, None)
    assert world.children.error(run, 0) == ("gave up after 1 attempt(s): boom" if last else "boom")


def test_a_first_take_whose_worker_died_is_counted_by_the_next_take(world: World) -> None:
    run = world.run(max_attempts=2)
    taken(world, run, [0])
    again = world.take_over(run)
    assert (again.fence, again.attempt) == (2, 1)
    assert world.seen(run)[:2] == (ChildState.RUNNING, 1)


def test_a_re_take_is_counted_as_it_starts(world: World) -> None:
    run = world.run()
    world.children.unclaim(taken(world, run, [0])[0])
    again = taken(world, run, [0])[0]
    assert (again.fence, again.attempt, again.counted) == (2, 0, True)
    started = world.children.start(again, 30)
    assert started is not None and started.attempt == 1
    assert world.seen(run)[:2] == (ChildState.RUNNING, 1)


def test_start_after_a_takeover_is_refused(world: World) -> None:
    run = world.run()
    c = taken(world, run, [0])[0]
    world.take_over(run)
    assert world.children.start(c, 30) is None
    assert world.seen(run)[2] == "other"


def test_start_with_no_attempt_left_is_refused(world: World) -> None:
    run = world.run(max_attempts=1)
    c = taken(world, run, [0])[0]
    assert world.children.start(c, 30) is not None
    assert world.children.start(c, 30) is None
    assert world.seen(run)[:2] == (ChildState.RUNNING, 1)


def test_write_batch_writes_each_success_under_its_own_fence(world: World) -> None:
    run = world.run(children=3)
    claims = taken(world, run, [0, 1, 2])
    done = [Finished(claims[0], {"done": 1}, "0", "said 0"), Finished(claims[1], None, "1")]
    written, started = world.children.write_batch(done, None, 30)
    assert (written, started) == ({claims[0].child_id, claims[1].child_id}, None)
    assert world.seen(run, 0) == (ChildState.SUCCEEDED, 1, None, {"done": 1})
    assert world.seen(run, 1)[:2] == (ChildState.SUCCEEDED, 1)
    assert (world.output(run, 0), world.output(run, 1)) == ("said 0", None)
    assert world.seen(run, 2)[:3] == (ChildState.RUNNING, 1, "batch")


def test_write_batch_skips_a_child_taken_over_and_writes_the_others(world: World) -> None:
    run = world.run(children=2)
    claims = taken(world, run, [0, 1])
    world.take_over(run, 1)
    done = [Finished(claims[0], None, None), Finished(claims[1], None, None)]
    assert world.children.write_batch(done, None, 30) == ({claims[0].child_id}, None)
    assert world.seen(run, 1)[:3] == (ChildState.RUNNING, 1, "other")


def test_write_batch_starts_the_next_child_in_the_same_write(world: World) -> None:
    run = world.run(children=2)
    claims = world.children.claim_many(run, [0, 1], "batch", 30)
    world.children.unclaim(claims[1])
    again = taken(world, run, [1])[1]  # a re-take: counted as it starts
    written, started = world.children.write_batch([Finished(claims[0], None, None)], again, 30)
    assert written == {claims[0].child_id}
    assert started is not None and (started.attempt, started.counted) == (1, True)
    assert world.seen(run, 1)[:2] == (ChildState.RUNNING, 1)


def test_write_batch_does_not_start_a_child_taken_over(world: World) -> None:
    run = world.run(children=1)
    c = taken(world, run, [0])[0]
    world.take_over(run)
    assert world.children.write_batch([], c, 30) == (set(), None)


def test_write_batch_writes_a_success_once(world: World) -> None:
    run = world.run(children=1)
    done = [Finished(taken(world, run, [0])[0], None, "1")]
    assert len(world.children.write_batch(done, None, 30)[0]) == 1
    assert world.children.write_batch(done, None, 30) == (set(), None)
    assert world.seen(run)[:2] == (ChildState.SUCCEEDED, 1)


def test_a_batch_child_s_heartbeat_renews_and_shows_a_cancel(world: World) -> None:
    run = world.run(children=2)
    claims = taken(world, run, [0, 1])
    assert world.children.renew_lease(claims[0], 30) is RunState.RUNNING
    world.runs.cancel(run)
    assert world.children.renew_lease(claims[1], 30) is RunState.CANCELLED


def test_the_last_child_of_a_message_written_lets_the_run_finish(world: World) -> None:
    run = world.run(children=2)
    claims = taken(world, run, [0, 1])
    done = [Finished(c, None, json.dumps(i)) for i, c in claims.items()]
    world.children.write_batch(done, None, 30)
    assert not world.children.any_unfinished(run)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


def test_unclaim_of_a_stale_claim_is_refused(world: World) -> None:
    run = world.run()
    c = taken(world, run, [0])[0]
    world.take_over(run)
    with pytest.raises(LeaseLost):
        world.children.unclaim(c)
