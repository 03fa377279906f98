"""A message the dispatcher sent is claimed as one row (issue 59's claim half,
dtask/db/message_claims.py): its children are written once, as each one ends, under the
message's fence. The rules test_message_claim.py states for claims per child, kept by this
claim: a duplicate takes nothing, a stale fence writes nothing, a lost lease re-sends only the
children not written, one failure fails one child, a drain hands the rest back unspent, a
cancelled run's message is out until it ends, and what the message's end leaves is sent
again. Run on both stores (conftest.py); each case fails with its rule broken in the fake."""

from __future__ import annotations

import json

import pytest

from dtask.db import Claim, Finished
from dtask.db.dispatch import Out
from dtask.domain.runs import ChildCounts, ChildState, ClaimRefusal, RunState
from dtask.exceptions import LeaseLost
from tests.contract.test_message_claim import STALE, Worker, attempts, counts, ids, write_stale
from tests.contract.worlds import World

RUNNING, PENDING = ChildState.RUNNING, ChildState.PENDING
SUCCEEDED, FAILED = ChildState.SUCCEEDED, ChildState.FAILED


def sent(world: World, children: int, max_attempts: int = 2) -> tuple[int, str]:
    """A running run whose ``children`` the dispatcher took in one message, and its queue."""
    queue = world.queue()
    run = world.waiting(children, client=world.client(), queue=queue, max_attempts=max_attempts)
    with world.turn() as turn:
        assert turn is not None
        taken = turn.take(run, children, children)
    assert [[c.index for c in m] for m in taken] == [list(range(children))]
    return run, queue


def holder(world: World, run: int, children: int, owner: str = "holder") -> Worker:
    w = Worker(world, world.message(run, range(children), owner))
    assert sorted(w.claims) == list(range(children))
    return w


def test_one_claim_covers_the_message_and_a_copy_takes_nothing(world: World) -> None:
    run, queue = sent(world, 4)
    assert world.out(queue) == Out(queued=4, running=0)
    w = holder(world, run, 4)
    assert len({c.fence for c in w.claims.values()}) == 1
    assert all(not c.counted and c.attempt == 1 for c in w.claims.values())
    assert world.message(run, range(4), "copy") == {}
    assert {world.refusal(run, i, "copy").reason for i in range(4)} == {ClaimRefusal.BUSY}
    assert world.out(queue) == Out(queued=0, running=4)
    assert counts(world, run) == ChildCounts(total=4, running=4)
    assert [world.seen(run, i)[:3] for i in range(4)] == [(RUNNING, 1, "holder")] * 4


def test_each_child_is_written_once_as_it_ends_and_the_end_leaves_nothing_out(
    world: World,
) -> None:
    run, queue = sent(world, 4)
    w = holder(world, run, 4)
    first = w.start(0, write=False)
    assert first is not None
    w.succeed(first)
    assert w.flush() == {first.child_id}
    assert world.out(queue) == Out(queued=0, running=3)
    w.run(1, 2, 3)
    assert w.written == ids(w.claims)
    assert world.children.close(first) == []
    assert world.out(queue) is None
    assert attempts(world, run, 4) == [(SUCCEEDED, 1)] * 4
    assert counts(world, run) == ChildCounts(total=4, succeeded=4)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


@pytest.mark.parametrize("write", STALE)
def test_a_lost_lease_re_sends_what_it_covered_and_the_stale_holder_writes_nothing(
    world: World, write: str
) -> None:
    run, _ = sent(world, 3, max_attempts=3)
    old = holder(world, run, 3, "old")
    first = old.start(0)
    assert first is not None
    world.lapse(run, range(3))
    resent = world.recovery.release_expired()
    assert sorted(r.index for r in resent if r.run_id == run) == [0, 1, 2]
    assert all(world.sent(run, i) for i in range(3))
    new = {i: world.claim(run, i, "new") for i in range(3)}
    assert [c.attempt for c in new.values()] == [1, 1, 1]  # the lost take spent none
    before = [world.seen(run, i) for i in range(3)]
    write_stale(world, write, (first, old.claims[1], old.claims[2]))
    assert [world.seen(run, i) for i in range(3)] == before
    assert world.children.close(first) == []  # nor can its end send anything again
    for claim in new.values():
        world.children.finish(claim, None)
    assert attempts(world, run, 3) == [(SUCCEEDED, 1)] * 3
    assert counts(world, run) == ChildCounts(total=3, succeeded=3)


def test_a_paused_holder_that_wakes_before_the_reaper_still_writes(world: World) -> None:
    run, _ = sent(world, 3)
    w = holder(world, run, 3)
    world.lapse(run, range(3))
    w.run(0, 1, 2)
    assert w.written == ids(w.claims)
    assert attempts(world, run, 3) == [(SUCCEEDED, 1)] * 3


def test_a_crash_after_some_successes_re_sends_only_the_rest(world: World) -> None:
    run, _ = sent(world, 5)
    dead = holder(world, run, 5, "dead")
    for index in (0, 1):
        started = dead.start(index, write=False)
        assert started is not None
        dead.succeed(started)
    third = dead.start(2)
    assert third is not None
    dead.flush()
    world.lapse(run, range(5))
    resent = [r.index for r in world.recovery.release_expired() if r.run_id == run]
    assert sorted(resent) == [2, 3, 4]
    assert world.children.write_batch([Finished(third, None, "2")], None, 30) == (set(), None)
    for index in resent:
        world.children.finish(world.claim(run, index, "again"), None)
    assert world.refusal(run, 0).reason is ClaimRefusal.DONE
    assert attempts(world, run, 5) == [(SUCCEEDED, 1)] * 5
    assert world.runs.finalize(run) is RunState.SUCCEEDED


@pytest.mark.parametrize("final", [False, True], ids=["retried", "permanent"])
def test_one_failure_takes_one_child_out_of_its_message(world: World, final: bool) -> None:
    run, queue = sent(world, 4)
    w = holder(world, run, 4)
    failing = w.start(1)
    assert failing is not None
    state = world.children.fail_attempt(failing, "ValueError: boom", final=final)
    assert state is (FAILED if final else PENDING)
    assert world.out(queue) == (Out(0, 3) if final else Out(queued=1, running=3))
    with pytest.raises(LeaseLost):  # out of the message: its claim no longer holds it
        world.children.unclaim(failing)
    w.run(0, 2, 3)
    assert w.written == ids(w.claims) - {failing.child_id}
    assert world.children.close(failing) == []
    assert world.seen(run, 1)[:2] == (state, 1)
    assert world.children.error(run, 1) is not None
    if not final:
        world.children.finish(world.claim(run, 1, "retry"), None)
    assert counts(world, run).succeeded == (3 if final else 4)


def test_a_drain_hands_the_unstarted_rest_back_unspent(world: World) -> None:
    run, queue = sent(world, 4)
    w = holder(world, run, 4)
    w.run(0)
    for index in (1, 2, 3):
        world.children.unclaim(w.claims[index])
    assert world.out(queue) == Out(queued=3, running=0)
    assert world.children.close(w.claims[0]) == []
    assert [world.seen(run, i)[:2] for i in (1, 2, 3)] == [(PENDING, 0)] * 3
    assert all(world.sent(run, i) for i in (1, 2, 3))
    assert {world.claim(run, i, "next").attempt for i in (1, 2, 3)} == {1}


def test_a_cancelled_run_s_message_is_out_until_it_ends(world: World) -> None:
    run, queue = sent(world, 4)
    w = holder(world, run, 4)
    first = w.start(0)
    assert first is not None
    assert world.runs.cancel(run) is RunState.CANCELLED
    assert world.children.renew_lease(first, 30) is RunState.CANCELLED
    assert world.out(queue) == Out(queued=0, running=4)
    world.children.release(first, {"done": 1})
    assert world.children.close(first) == []  # a cancelled run's children are not re-sent
    assert world.out(queue) is None
    assert world.seen(run, 0) == (PENDING, 0, None, {"done": 1})
    assert counts(world, run) == ChildCounts(total=4, pending=4)


def test_what_the_message_s_end_leaves_covered_is_sent_again(world: World) -> None:
    run, queue = sent(world, 4)
    w = holder(world, run, 4)
    w.run(0)
    again = world.children.close(w.claims[0])
    assert sorted(r.index for r in again) == [1, 2, 3]
    assert world.out(queue) == Out(queued=3, running=0)
    late: Claim = w.claims[1]
    with pytest.raises(LeaseLost):
        world.children.finish(late, None)
    assert world.children.write_batch([Finished(late, None, json.dumps(1))], None, 30) == (
        set(),
        None,
    )
    assert {world.claim(run, i, "next").attempt for i in (1, 2, 3)} == {1}


def test_a_copy_of_another_range_takes_its_children_one_by_one_not_the_message(
    world: World,
) -> None:
    """A message of a range the row does not have (a copy sent before a rerun's rows, whose
    batch size changed) claims per child, under fences of their own."""
    queue = world.queue()
    run = world.waiting(6, client=world.client(), queue=queue)
    with world.turn() as turn:
        assert turn is not None
        assert [[c.index for c in m] for m in turn.take(run, 4, 4)] == [[0, 1, 2, 3]]
    stale = world.message(run, range(6), "stale")
    assert sorted(stale) == list(range(6))
    assert {c.message for c in stale.values()} == {None}
    assert world.message(run, range(4), "holder") == {}  # the dispatcher's own copy: taken
    for claim in stale.values():
        world.children.finish(claim, None)
    assert counts(world, run) == ChildCounts(total=6, succeeded=6)


def test_a_revoked_child_is_counted_out_of_its_message(world: World) -> None:
    run, queue = sent(world, 4)
    holder(world, run, 4)
    assert world.children.revoke(run, 2, "revoked")
    assert world.out(queue) == Out(queued=0, running=3)
    assert counts(world, run) == ChildCounts(total=4, running=3, failed=1)


def test_a_revoked_child_stays_out_of_its_message_through_a_rerun(world: World) -> None:
    run, _ = sent(world, 4)
    w = holder(world, run, 4)
    w.run(0, 1, 3)
    assert world.children.revoke(run, 2, "revoked")
    assert world.runs.cancel(run) is RunState.CANCELLED
    assert world.runs.finalize(run) is RunState.CANCELLED
    assert world.runs.rerun(run) is RunState.SPLITTING
    assert world.seen(run, 2)[0] is PENDING
    with pytest.raises(LeaseLost):  # the message's claim covers it no more
        world.children.checkpoint(w.claims[2], {"done": 1}, 30)
    assert world.children.renew_lease(w.claims[2], 30) is None
