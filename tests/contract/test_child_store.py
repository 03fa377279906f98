"""The child store's contract, one child at a time: claims under a lease with a fence, refusals,
takeover, heartbeats, checkpoints, finish, failed attempts, hand-back, revoke, and the run
moves the lifecycle reaches (dispatch, cancel, finalize). Run on both stores (conftest.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from dtask.db import Claim, RunRecord
from dtask.domain.runs import ChildState, ClaimRefusal, RunState
from dtask.exceptions import InvalidResult, LeaseLost, RunNotFound
from tests.contract.worlds import World


def test_a_claim_takes_a_pending_child_under_a_new_fence(world: World) -> None:
    run = world.run(children=2, max_attempts=3)
    c = world.claim(run, 0, "me")
    assert (c.fence, c.attempt, c.max_attempts, c.spec, c.checkpoint) == (1, 1, 3, {"i": 0}, None)
    assert c.counted and c.execution_cap is None
    assert world.seen(run, 0)[:3] == (ChildState.RUNNING, 1, "me")
    assert world.seen(run, 1)[:3] == (ChildState.PENDING, 0, None)


def test_a_claim_carries_the_run_s_execution_cap(world: World) -> None:
    assert world.claim(world.run(execution_cap=2.5)).execution_cap == 2.5


def test_a_held_child_is_refused_as_busy_and_stays_its_holder_s(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    assert world.refusal(run).reason is ClaimRefusal.BUSY
    assert world.children.renew_lease(c, 30) is RunState.RUNNING
    assert world.view(run).owner == "me"


def test_a_child_that_is_not_there_is_gone(world: World) -> None:
    assert world.refusal(world.run(), 99).reason is ClaimRefusal.GONE


def test_a_cancelled_run_s_children_are_not_taken(world: World) -> None:
    run = world.run()
    assert world.runs.cancel(run) is RunState.CANCELLED
    assert world.refusal(run).reason is ClaimRefusal.INACTIVE
    assert world.seen(run)[:3] == (ChildState.PENDING, 0, None)


def test_only_a_cancel_that_terminates_is_terminating_and_a_later_cancel_says_anew(
    world: World,
) -> None:
    plain, hard = world.run(), world.run()
    assert not world.runs.terminating(plain)
    world.runs.cancel(plain)
    assert world.runs.cancel(hard, terminate=True) is RunState.CANCELLED
    assert (world.runs.terminating(plain), world.runs.terminating(hard)) == (False, True)
    world.runs.rerun(hard)
    assert not world.runs.terminating(hard)  # running again: nothing to terminate
    world.runs.cancel(hard)
    assert not world.runs.terminating(hard)


def test_a_splitting_run_s_children_are_taken(world: World) -> None:
    assert world.claim(world.run(dispatched=False)).fence == 1


def test_a_succeeded_child_is_reported_done(world: World) -> None:
    run = world.run()
    world.children.finish(world.claim(run), None)
    assert world.refusal(run).reason is ClaimRefusal.DONE


def test_an_expired_lease_is_taken_over_and_the_fence_moves(world: World) -> None:
    run = world.run(max_attempts=3)
    old = world.claim(run)
    new = world.take_over(run)
    assert (new.fence, new.attempt) == (old.fence + 1, 2)
    assert world.seen(run)[:3] == (ChildState.RUNNING, 2, "other")


STALE_WRITES: dict[str, Callable[[World, Claim], object]] = {
    "checkpoint": lambda w, c: w.children.checkpoint(c, {"done": 5}, 30),
    "finish": lambda w, c: w.children.finish(c, {"done": 9}, "1"),
    "release": lambda w, c: w.children.release(c, {"done": 5}),
    "fail_attempt": lambda w, c: w.children.fail_attempt(c, "ValueError: late"),
    "unclaim": lambda w, c: w.children.unclaim(c),
}


@pytest.mark.parametrize("write", STALE_WRITES)
def test_a_stale_holder_s_write_is_refused_and_changes_nothing(world: World, write: str) -> None:
    run = world.run(max_attempts=3)
    old = world.claim(run)
    world.take_over(run)
    with pytest.raises(LeaseLost, match=f"fence {old.fence} is stale"):
        STALE_WRITES[write](world, old)
    assert world.seen(run) == (ChildState.RUNNING, 2, "other", None)
    assert world.children.error(run, 0) is None


def test_a_stale_holder_s_heartbeat_learns_it_lost_the_child(world: World) -> None:
    run = world.run()
    old = world.claim(run)
    new = world.take_over(run)
    assert world.children.renew_lease(old, 30) is None
    assert world.children.renew_lease(new, 30) is RunState.RUNNING


def test_a_heartbeat_renews_the_lease(world: World) -> None:
    run = world.run()
    c = world.claim(run, ttl=0.2)
    assert world.children.renew_lease(c, 30) is RunState.RUNNING
    time.sleep(0.3)
    assert world.refusal(run).reason is ClaimRefusal.BUSY


def test_a_lease_not_renewed_runs_out(world: World) -> None:
    run = world.run()
    world.claim(run, ttl=0.05)
    time.sleep(0.1)
    assert world.claim(run, owner="other").fence == 2


def test_a_lease_renewed_for_no_time_ends_at_once(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    assert world.children.renew_lease(c, 0) is RunState.RUNNING
    time.sleep(0.01)
    assert world.claim(run, owner="other").fence == 2


def test_a_heartbeat_shows_a_cancel_and_the_child_stays_its_holder_s(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    world.runs.cancel(run)
    assert world.children.renew_lease(c, 30) is RunState.CANCELLED
    world.children.release(c, {"done": 1})  # it stops at its checkpoint
    assert world.seen(run) == (ChildState.PENDING, 0, None, {"done": 1})


def test_a_checkpoint_renews_the_lease(world: World) -> None:
    run = world.run()
    c = world.claim(run, ttl=0.2)
    world.children.checkpoint(c, {"done": 1}, 30)
    time.sleep(0.3)
    assert world.refusal(run).reason is ClaimRefusal.BUSY


def test_a_retry_resumes_from_the_last_checkpoint(world: World) -> None:
    run = world.run(max_attempts=3)
    first = world.claim(run)
    world.children.checkpoint(first, {"done": 3}, 30)
    assert world.children.fail_attempt(first, "ValueError: one") is ChildState.PENDING
    assert world.seen(run) == (ChildState.PENDING, 1, None, {"done": 3})
    assert world.children.error(run, 0) == "ValueError: one"
    second = world.claim(run)
    assert (second.fence, second.attempt, second.checkpoint) == (2, 2, {"done": 3})


def test_finish_writes_the_success_once(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    world.children.checkpoint(c, {"done": 1}, 30)
    world.children.finish(c, {"done": 2}, json.dumps("r"))
    assert world.seen(run) == (ChildState.SUCCEEDED, 1, None, {"done": 2})
    with pytest.raises(LeaseLost):
        world.children.finish(c, None)


def test_finish_without_a_checkpoint_keeps_the_last_committed_one(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    world.children.checkpoint(c, {"done": 5}, 30)
    world.children.finish(c, None)
    assert world.view(run).checkpoint == {"done": 5}


def test_a_success_clears_an_earlier_attempt_s_error(world: World) -> None:
    run = world.run()
    world.children.fail_attempt(world.claim(run), "ValueError: one")
    world.children.finish(world.claim(run), None)
    assert world.children.error(run, 0) is None


def test_a_success_keeps_what_it_printed_in_place_of_a_failed_attempt_s(world: World) -> None:
    run = world.run(children=2)
    world.children.fail_attempt(world.claim(run), "ValueError: one", None, "tried")
    assert world.output(run, 0) == "tried"
    world.children.finish(world.claim(run), None, None, "done 1..10")
    assert world.output(run, 0) == "done 1..10"
    world.children.finish(world.claim(run, 1), None)
    assert world.output(run, 1) is None


def test_release_hands_the_child_back_once_with_its_attempt_uncounted(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    world.children.release(c, {"done": 2})
    assert world.seen(run) == (ChildState.PENDING, 0, None, {"done": 2})
    with pytest.raises(LeaseLost):
        world.children.release(c, None)
    again = world.claim(run)
    assert (again.fence, again.attempt, again.checkpoint) == (2, 1, {"done": 2})


def test_release_without_a_checkpoint_keeps_the_committed_one(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    world.children.checkpoint(c, {"done": 4}, 30)
    world.children.release(c, None)
    assert world.view(run).checkpoint == {"done": 4}


def test_the_last_failed_attempt_fails_the_child_for_good(world: World) -> None:
    run = world.run(max_attempts=2)
    world.children.fail_attempt(world.claim(run), "ValueError: one")
    assert world.children.fail_attempt(world.claim(run), "ValueError: two") is ChildState.FAILED
    error = "gave up after 2 attempt(s): ValueError: two"
    assert world.seen(run)[:2] == (ChildState.FAILED, 2)
    assert world.children.error(run, 0) == error
    refused = world.refusal(run)
    assert (refused.reason, refused.error) == (ClaimRefusal.FAILED, error)


def test_a_permanent_error_fails_the_child_at_once_with_attempts_left(world: World) -> None:
    run = world.run(max_attempts=3)
    world.children.fail_attempt(world.claim(run), "ValueError: one")
    ends = world.children.fail_attempt(world.claim(run), "KeyError: 'x'", None, None, final=True)
    assert ends is ChildState.FAILED
    error = "not retried (a permanent error) at attempt 2: KeyError: 'x'"
    assert world.seen(run)[:2] == (ChildState.FAILED, 2)
    assert world.children.error(run, 0) == error
    assert world.refusal(run).reason is ClaimRefusal.FAILED


@pytest.mark.parametrize("attempts", [1, 2, 3])
def test_each_failed_attempt_but_the_last_goes_back_to_pending(world: World, attempts: int) -> None:
    run = world.run(max_attempts=attempts)
    ends = [world.children.fail_attempt(world.claim(run), f"E{i}") for i in range(attempts)]
    assert ends == [ChildState.PENDING] * (attempts - 1) + [ChildState.FAILED]
    assert world.children.error(run, 0) == f"gave up after {attempts} attempt(s): E{attempts - 1}"


def test_a_child_whose_holders_keep_dying_fails_when_its_attempts_are_spent(
    world: World,
) -> None:
    run = world.run(max_attempts=3)
    world.claim(run)
    world.take_over(run)
    world.take_over(run, owner="third")
    world.expire(run, 0)
    refused = world.refusal(run)
    error = "gave up after 3 attempt(s): its worker process died while running it"
    assert (refused.reason, refused.error) == (ClaimRefusal.FAILED, error)
    assert world.seen(run)[:3] == (ChildState.FAILED, 3, None)


def test_a_child_on_its_last_attempt_under_a_live_lease_is_busy(world: World) -> None:
    run = world.run(max_attempts=1)
    world.claim(run)
    assert world.refusal(run).reason is ClaimRefusal.BUSY
    assert world.view(run).state is ChildState.RUNNING


def test_revoke_fails_an_unfinished_child_whatever_its_fence(world: World) -> None:
    run = world.run()
    c = world.claim(run)
    assert world.children.revoke(run, 0, "revoked") and world.children.revoke(run, 1, "revoked")
    with pytest.raises(LeaseLost):
        world.children.finish(c, None)
    refused = world.refusal(run)
    assert (refused.reason, refused.error) == (ClaimRefusal.FAILED, "revoked")
    assert not world.children.revoke(run, 0, "again") and world.view(run, 1).owner is None


def test_any_unfinished_until_the_last_child_ends(world: World) -> None:
    run = world.run(children=2, max_attempts=1)
    assert world.children.any_unfinished(run)
    world.children.finish(world.claim(run, 0), None)
    assert world.children.any_unfinished(run)
    world.children.fail_attempt(world.claim(run, 1), "ValueError: x")
    assert not world.children.any_unfinished(run)


def finished(world: World, run: int, children: int = 2) -> None:
    for index in range(children):
        world.children.finish(world.claim(run, index), None, json.dumps(index * 10))


def test_finalize_waits_for_every_child(world: World) -> None:
    run = world.run(children=2)
    world.children.finish(world.claim(run, 0), None)
    assert world.runs.finalize(run) is RunState.RUNNING


def test_finalize_succeeds_once_and_ends_the_run_s_chord_once(world: World) -> None:
    run = world.run(children=2)
    finished(world, run)
    ended: list[str] = []
    assert world.runs.finalize(run, ended=ended) is RunState.SUCCEEDED
    assert world.runs.finalize(run, ended=ended) is RunState.SUCCEEDED
    assert ended == [f"dtask-{run}-1"] and world.runs.get(run).state is RunState.SUCCEEDED


def test_finalize_fails_a_run_with_a_failed_child(world: World) -> None:
    run = world.run(children=2, max_attempts=1)
    world.children.finish(world.claim(run, 0), None)
    world.children.fail_attempt(world.claim(run, 1), "ValueError: x")
    assert world.runs.finalize(run) is RunState.FAILED
    assert world.runs.get(run).state is RunState.FAILED


def test_a_splitting_run_succeeds_only_once_dispatched(world: World) -> None:
    """A rerun's run is splitting: its own dispatch's chord finalizes it, not a late one."""
    run = world.run(children=2, dispatched=False)
    finished(world, run)
    assert world.runs.finalize(run) is RunState.SPLITTING
    sent: list[list[tuple[int, dict[str, Any]]]] = []
    assert world.runs.dispatch(run, lambda r, children: sent.append(children)) is RunState.RUNNING
    assert sent == [[]] and world.runs.finalize(run) is RunState.SUCCEEDED


def test_a_splitting_run_with_a_failed_child_is_failed_at_once(world: World) -> None:
    run = world.run(children=1, max_attempts=1, dispatched=False)
    world.children.fail_attempt(world.claim(run), "ValueError: x")
    assert world.runs.finalize(run) is RunState.FAILED


def test_dispatch_sends_the_unfinished_children_once(world: World) -> None:
    run = world.run(children=3, dispatched=False)
    world.children.finish(world.claim(run, 0), None)
    sent: list[list[tuple[int, dict[str, Any]]]] = []
    for _ in range(2):
        assert world.runs.dispatch(run, lambda r, ch: sent.append(ch)) is RunState.RUNNING
    assert sent == [[(1, {"i": 1}), (2, {"i": 2})]]


def test_a_reduce_gets_the_results_in_index_order_and_its_error_fails_the_run(
    world: World,
) -> None:
    loaded: list[list[Any]] = []

    def summed(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
        loaded.append(load())
        return json.dumps(sum(load()))

    def broken(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
        raise InvalidResult("reduce said no")

    good, bad, skipped = world.run(), world.run(), world.run()
    for run in (good, bad, skipped):
        finished(world, run, children=3)
    assert world.runs.finalize(good, reduce=summed) is RunState.SUCCEEDED
    assert loaded == [[0, 10, 20]]
    assert world.runs.finalize(bad, reduce=broken) is RunState.FAILED
    no_reduce = world.runs.finalize(skipped, reduce=broken, reduces=lambda template: False)
    assert no_reduce is RunState.SUCCEEDED


def test_a_cancelled_run_stays_cancelled(world: World) -> None:
    run = world.run(children=1)
    c = world.claim(run)
    world.runs.cancel(run)
    world.children.finish(c, None)  # it was finishing as the cancel came
    ended: list[str] = []
    assert world.runs.finalize(run, ended=ended) is RunState.CANCELLED and ended == []
    assert world.runs.cancel(run) is RunState.CANCELLED


def test_a_finished_run_without_chains_has_none_to_send(world: World) -> None:
    run = world.run(children=1)
    finished(world, run, children=1)
    assert world.runs.finalize(run) is RunState.SUCCEEDED
    assert not world.runs.take_chains(run, lambda chained: pytest.fail(f"sent {chained}"))


def test_get_reads_the_run(world: World) -> None:
    run = world.run(children=3, max_attempts=4)
    got = world.runs.get(run)
    assert (got.id, got.template, got.state, got.max_attempts) == (run, "t", RunState.RUNNING, 4)
    assert (got.child_total, got.chord_size, got.group_id, got.dispatches) == (
        3, 3, f"dtask-{run}-1", 1,
    )  # fmt: skip
    with pytest.raises(RunNotFound):
        world.runs.get(run + 10_000_000)
