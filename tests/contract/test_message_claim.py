"""The rules a message's claim keeps (issue 59), for a message of several children of one run:
taken together (``claim_many``) and worked through as dtask/worker/batch.py does. Written
against today's claim per child, to hold unchanged once one claim covers the message: a stale
fence writes nothing, a stolen half is owned once, a cancelled run's message is out until its
children stop, a failure or an execution cap fails one child and not its siblings, a crash
after some successes redoes only the rest, a drain hands the unstarted rest back. Run on both
stores (conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

from dtask.db import Claim, Finished
from dtask.db.dispatch import Out
from dtask.domain.runs import ChildCounts, ChildState, ClaimRefusal, RunState
from dtask.exceptions import LeaseLost
from tests.contract.worlds import World

RUNNING, PENDING = ChildState.RUNNING, ChildState.PENDING
SUCCEEDED, FAILED = ChildState.SUCCEEDED, ChildState.FAILED


@dataclass
class Worker:
    """A worker going through its message as ``batch.Held`` does: a child started with the
    successes held before it in one write (one taken for the first time may start without
    one), its success held, what is still held written at the message's end (``flush``)."""

    world: World
    claims: dict[int, Claim]
    held: list[Finished] = field(default_factory=list)
    written: set[int] = field(default_factory=set)

    def start(self, index: int, write: bool = True) -> Claim | None:
        claim = self.claims[index]
        if not write and not claim.counted:
            return claim
        written, started = self.world.children.write_batch(self.held, claim, 30)
        self._wrote(written)
        if started is not None:
            self.claims[index] = started
        return started

    def succeed(self, claim: Claim, checkpoint: object = None) -> None:
        self.held.append(Finished(claim, checkpoint, json.dumps(claim.spec)))

    def flush(self) -> set[int]:
        written, _ = self.world.children.write_batch(self.held, None, 30)
        self._wrote(written)
        return written

    def run(self, *indexes: int) -> None:
        """The children ``indexes`` run to success, then the message ends."""
        for index in indexes:
            started = self.start(index)
            assert started is not None, f"child {index} not started"
            self.succeed(started)
        self.flush()

    def _wrote(self, written: set[int]) -> None:
        self.written |= written
        self.held = []


def worker(world: World, run: int, indexes: Iterable[int], owner: str = "batch") -> Worker:
    return Worker(world, world.message(run, indexes, owner))


def ids(claims: dict[int, Claim]) -> set[int]:
    return {c.child_id for c in claims.values()}


def counts(world: World, run: int) -> ChildCounts:
    return world.runs.status(run).children


def attempts(world: World, run: int, children: int) -> list[tuple[ChildState, int]]:
    return [world.seen(run, i)[:2] for i in range(children)]


# A write of a claim whose fence moved, and what it answers where it does not raise LeaseLost
STALE: dict[str, Callable[[World, Claim], object]] = {
    "write_batch": lambda w, c: w.children.write_batch([Finished(c, {"done": 9}, "9")], None, 30),
    "start": lambda w, c: w.children.start(c, 30),
    "start_with_the_held": lambda w, c: w.children.write_batch([], c, 30),
    "renew_lease": lambda w, c: w.children.renew_lease(c, 30),
    "checkpoint": lambda w, c: w.children.checkpoint(c, {"done": 5}, 30),
    "finish": lambda w, c: w.children.finish(c, {"done": 9}, "9"),
    "fail_attempt": lambda w, c: w.children.fail_attempt(c, "ValueError: late"),
    "release": lambda w, c: w.children.release(c, {"done": 5}),
    "unclaim": lambda w, c: w.children.unclaim(c),
}
QUIET: dict[str, object] = {
    "write_batch": (set(), None),
    "start": None,
    "start_with_the_held": (set(), None),
    "renew_lease": None,
}


def write_stale(world: World, write: str, claims: Iterable[Claim]) -> None:
    """``write`` with each of ``claims``, whose fences moved: LeaseLost, or nothing done."""
    for stale in claims:
        if write in QUIET:
            assert STALE[write](world, stale) == QUIET[write]
        else:
            with pytest.raises(LeaseLost, match=f"fence {stale.fence} is stale"):
                STALE[write](world, stale)


@pytest.mark.parametrize("write", STALE)
def test_a_stale_fence_writes_nothing_and_the_new_holder_s_writes_land(
    world: World, write: str
) -> None:
    run = world.run(children=3, max_attempts=3)
    old = worker(world, run, range(3), "old")
    first = old.start(0)
    assert first is not None
    world.lapse(run, range(3))
    new = worker(world, run, range(3), "new")
    assert sorted(new.claims) == [0, 1, 2] and {c.fence for c in new.claims.values()} == {2}
    before = [world.seen(run, i) for i in range(3)]
    assert {s[2] for s in before} == {"new"}
    write_stale(world, write, (first, old.claims[1], old.claims[2]))
    assert [world.seen(run, i) for i in range(3)] == before
    assert [world.children.error(run, i) for i in range(3)] == [None] * 3
    new.run(0, 1, 2)
    assert new.written == ids(new.claims)
    # the dead holder's started attempt stays counted; its first takes never started spend none
    assert attempts(world, run, 3) == [(SUCCEEDED, 2), (SUCCEEDED, 1), (SUCCEEDED, 1)]
    assert counts(world, run) == ChildCounts(total=3, succeeded=3)


def test_a_lease_run_out_but_not_taken_over_is_still_its_holder_s(world: World) -> None:
    """A paused worker that resumes before another takes its message writes as before."""
    run = world.run(children=3)
    w = worker(world, run, range(3))
    first = w.start(0, write=False)
    assert first is not None
    w.succeed(first)
    world.lapse(run, range(3))
    w.run(1, 2)
    assert w.written == ids(w.claims)
    assert attempts(world, run, 3) == [(SUCCEEDED, 1)] * 3


def test_a_stolen_half_of_a_message_is_owned_once(world: World) -> None:
    run = world.run(children=6)
    old = worker(world, run, range(6), "old")
    assert world.message(run, range(6), "duplicate") == {}  # held: a redelivery takes nothing
    for index in (0, 1):
        started = old.start(index)
        assert started is not None
        old.succeed(started)
    third = old.start(2)
    assert third is not None
    stolen = world.steal(run, [3, 4, 5])
    assert sorted(stolen) == [3, 4, 5] and {world.view(run, i).owner for i in stolen} == {"thief"}
    thief = Worker(world, stolen)
    old.succeed(third)
    assert old.start(3) is None  # its fence moved: the batch path claims it alone, refused
    assert world.refusal(run, 3, "old").reason is ClaimRefusal.BUSY
    late = [Finished(old.claims[i], None, "0") for i in (3, 4, 5)]
    assert world.children.write_batch(late, None, 30) == (set(), None)
    old.flush()
    assert world.message(run, range(6), "thief") == {}  # nor can the thief take the old half
    thief.run(3, 4, 5)
    assert old.written == {old.claims[i].child_id for i in (0, 1, 2)}
    assert thief.written == ids(stolen) and not old.written & thief.written
    assert attempts(world, run, 6) == [(SUCCEEDED, 1)] * 6
    assert counts(world, run) == ChildCounts(total=6, succeeded=6)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


def test_a_range_given_away_from_a_message_is_owned_once(world: World) -> None:
    run = world.ranges((1, 100), (101, 200))
    w = worker(world, run, [0, 1], "old")
    first = w.start(0)
    assert first is not None
    world.children.checkpoint(first, {"done": 10}, 30)
    gift = world.children.give_away(first, run, ("a", "b"), 100, 51, deferred=False)
    assert gift is not None and gift.index == 2
    thief = worker(world, run, [0, 1, 2], "thief")
    assert sorted(thief.claims) == [2] and thief.claims[2].spec == {"a": 51, "b": 100}
    assert world.refusal(run, 2, "old").reason is ClaimRefusal.BUSY
    with pytest.raises(LeaseLost):  # the half given away is no longer its holder's to cut
        world.children.give_away(first, run, ("a", "b"), 100, 76, deferred=False)
    w.succeed(first, {"done": 50})
    w.run(1)
    thief.run(2)
    specs = [world.spec(run, i) for i in range(3)]
    assert specs == [{"a": 1, "b": 50}, {"a": 101, "b": 200}, {"a": 51, "b": 100}]
    numbers = sorted(n for s in specs for n in range(s["a"], s["b"] + 1))
    assert numbers == list(range(1, 201))
    assert counts(world, run) == ChildCounts(total=3, succeeded=3)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


def test_a_cancelled_run_s_message_is_out_until_its_children_stop(world: World) -> None:
    q = world.queue()
    run = world.waiting(5, client=world.client(), queue=q)
    with world.turn() as turn:
        assert turn is not None
        sent = [c.index for m in turn.take(run, 4) for c in m]
    w = worker(world, run, sent)
    assert sorted(w.claims) == [0, 1, 2, 3]
    first = w.start(0)
    assert first is not None
    assert world.runs.cancel(run) is RunState.CANCELLED
    assert world.children.renew_lease(first, 30) is RunState.CANCELLED
    assert world.out(q) == Out(queued=0, running=4)  # they hold their slots until they stop
    assert world.message(run, range(5), "other") == {}
    assert {world.refusal(run, i, "other").reason for i in range(5)} == {ClaimRefusal.INACTIVE}
    assert run not in world.demanded()
    world.children.release(first, {"done": 1})  # it stops at its checkpoint
    for index in (1, 2, 3):
        world.children.unclaim(w.claims[index])
    assert world.out(q) is None
    assert world.seen(run, 0) == (PENDING, 0, None, {"done": 1})
    assert [world.seen(run, i) for i in range(1, 5)] == [(PENDING, 0, None, None)] * 4
    world.lapse(run, range(5))
    assert world.message(run, range(5), "other") == {} and run not in world.demanded()
    assert counts(world, run) == ChildCounts(total=5, pending=5)


def test_a_cancelled_message_s_running_child_ends_under_its_claim_and_is_counted_once(
    world: World,
) -> None:
    run = world.run(children=3)
    w = worker(world, run, range(3), "old")
    first = w.start(0, write=False)
    assert first is not None
    w.succeed(first)
    second = w.start(1)
    assert second is not None
    world.runs.cancel(run)
    world.children.unclaim(w.claims[2])
    assert world.runs.finalize(run) is RunState.CANCELLED
    assert world.runs.rerun(run) is RunState.SPLITTING
    again = worker(world, run, range(3), "again")
    assert sorted(again.claims) == [2]  # the one still running stays its holder's
    w.succeed(second)
    assert w.flush() == {second.child_id}
    again.run(2)
    assert world.runs.dispatch(run, lambda r, sent: None) is RunState.RUNNING
    assert world.runs.finalize(run) is RunState.SUCCEEDED
    assert attempts(world, run, 3) == [(SUCCEEDED, 1)] * 3
    assert counts(world, run) == ChildCounts(total=3, succeeded=3)


CAP = "run {run} child 1 attempt 1 exceeded its execution cap of 0.5 s"
FAILS: dict[str, Callable[[World, int, Claim], object]] = {
    "execution_cap": lambda w, run, c: w.children.fail_attempt(c, CAP.format(run=run)),
    "killed_past_its_cap": lambda w, run, c: w.children.fail_attempt(
        c, CAP.format(run=run) + "; it did not stop within 1 s and its process was killed"
    ),
    "error": lambda w, run, c: w.children.fail_attempt(c, "ValueError: boom"),
    "permanent_error": lambda w, run, c: w.children.fail_attempt(c, "KeyError: 'x'", final=True),
    "revoke": lambda w, run, c: w.children.revoke(run, 1, "revoked"),
}


@pytest.mark.parametrize("how", FAILS)
def test_one_failing_child_fails_alone_not_its_message_s_siblings(world: World, how: str) -> None:
    run = world.run(children=4, max_attempts=1, execution_cap=0.5)
    w = worker(world, run, range(4))
    assert {c.execution_cap for c in w.claims.values()} == {0.5}
    first = w.start(0, write=False)
    assert first is not None
    w.succeed(first)
    failing = w.start(1)
    assert failing is not None
    FAILS[how](world, run, failing)
    with pytest.raises(LeaseLost):  # the batch path's hand-back of a retried child: as is
        world.children.unclaim(failing)
    w.run(2, 3)
    assert w.written == ids(w.claims) - {failing.child_id}
    assert attempts(world, run, 4) == [(SUCCEEDED, 1), (FAILED, 1), (SUCCEEDED, 1), (SUCCEEDED, 1)]
    errors = [world.children.error(run, i) for i in range(4)]
    assert errors[1] is not None and errors[:1] + errors[2:] == [None] * 3
    assert counts(world, run) == ChildCounts(total=4, succeeded=3, failed=1)
    assert world.runs.finalize(run) is RunState.FAILED


def test_a_child_past_its_cap_with_attempts_left_is_retried_alone(world: World) -> None:
    run = world.run(children=3, max_attempts=2, execution_cap=0.5)
    w = worker(world, run, range(3))
    first = w.start(0, write=False)
    assert first is not None and not first.counted
    assert world.children.fail_attempt(first, CAP.format(run=run)) is PENDING
    w.run(1, 2)
    assert w.written == ids(w.claims) - {first.child_id}
    retried = world.claim(run, 0, "alone")
    assert (retried.fence, retried.attempt, retried.execution_cap) == (2, 2, 0.5)
    world.children.finish(retried, None)
    assert attempts(world, run, 3) == [(SUCCEEDED, 2), (SUCCEEDED, 1), (SUCCEEDED, 1)]
    assert counts(world, run) == ChildCounts(total=3, succeeded=3)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


@pytest.mark.parametrize("third_started", [False, True], ids=["unwritten", "written"])
def test_a_crash_after_some_successes_redoes_only_the_rest(
    world: World, third_started: bool
) -> None:
    run = world.run(children=5, max_attempts=2)
    dead = worker(world, run, range(5), "dead")
    for index in (0, 1):
        started = dead.start(index, write=False)
        assert started is not None
        dead.succeed(started)
    third = dead.start(2, write=third_started)
    assert third is not None
    if not third_started:
        dead.flush()  # the running child's heartbeat writes the held successes
    assert dead.written == {dead.claims[0].child_id, dead.claims[1].child_id}
    world.lapse(run, range(5))  # the worker dies running the third
    again = worker(world, run, range(5), "again")
    assert sorted(again.claims) == [2, 3, 4]
    # a first take that never started or never ended spent no attempt; a started one did
    spent = [again.claims[i].attempt for i in (2, 3, 4)]
    assert spent == [1 if third_started else 0, 0, 0]
    assert all(c.counted and c.fence == 2 for c in again.claims.values())
    assert world.children.write_batch([Finished(third, None, "2")], None, 30) == (set(), None)
    again.run(2, 3, 4)
    assert again.written == ids(again.claims)
    assert world.message(run, range(5), "redelivered") == {}
    assert world.refusal(run, 0).reason is ClaimRefusal.DONE
    third_attempts = 2 if third_started else 1
    assert (
        attempts(world, run, 5)
        == [(SUCCEEDED, 1)] * 2 + [(SUCCEEDED, third_attempts)] + [(SUCCEEDED, 1)] * 2
    )
    assert counts(world, run) == ChildCounts(total=5, succeeded=5)
    assert world.runs.finalize(run) is RunState.SUCCEEDED


def test_a_drain_hands_the_unstarted_rest_back_without_spending_attempts(world: World) -> None:
    run = world.run(children=5, max_attempts=1)
    w = worker(world, run, range(5), "draining")
    first = w.start(0, write=False)
    assert first is not None
    w.succeed(first)
    second = w.start(1)
    assert second is not None
    world.children.checkpoint(second, {"done": 3}, 30)
    world.children.release(second, None)  # the running child stops at its checkpoint
    for index in (2, 3, 4):
        world.children.unclaim(w.claims[index])
    assert w.flush() == set()  # 0's success went with 1's start
    assert world.seen(run, 0)[:2] == (SUCCEEDED, 1)
    assert world.seen(run, 1) == (PENDING, 0, None, {"done": 3})
    assert [world.seen(run, i) for i in (2, 3, 4)] == [(PENDING, 0, None, None)] * 3
    nxt = worker(world, run, range(5), "next")
    assert sorted(nxt.claims) == [1, 2, 3, 4] and nxt.claims[1].checkpoint == {"done": 3}
    for index in (1, 2, 3, 4):
        with pytest.raises(LeaseLost):
            world.children.unclaim(w.claims[index])
    nxt.run(1, 2, 3, 4)
    assert nxt.written == ids(nxt.claims)
    assert attempts(world, run, 5) == [(SUCCEEDED, 1)] * 5
    assert counts(world, run) == ChildCounts(total=5, succeeded=5)
