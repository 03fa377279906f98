"""The store against a real PostgreSQL: exactly-once split, fencing, retries, finalize."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dtask import services
from dtask.db import Claim, Refusal, RunRecord, Store
from dtask.domain.runs import ChildState, ClaimRefusal, NewRun, RunState
from dtask.exceptions import InvalidResult, KeyConflict, LeaseLost, RunNotFound


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def new_run(store: Store, children: int = 3, max_attempts: int = 2) -> int:
    run_id, created = store.runs.create(
        NewRun("t", f"test:{uuid.uuid4()}", {"n": children}, max_attempts, None)
    )
    assert created
    state = store.runs.split(run_id, lambda run, slots: [{"i": i} for i in range(children)])
    assert state is RunState.SPLITTING
    return run_id


def claim(store: Store, run_id: int, index: int = 0, ttl: float = 30) -> Claim:
    taken = store.children.claim(run_id, index, "me", ttl)
    assert isinstance(taken, Claim), taken
    return taken


def test_same_key_returns_the_same_run(store: Store) -> None:
    key = f"test:{uuid.uuid4()}"
    first, created = store.runs.create(NewRun("t", key, {"n": 1}, 3, None))
    second, created_again = store.runs.create(NewRun("t", key, {"n": 1}, 3, None))
    assert (first, created) == (second, True) and created_again is False
    with pytest.raises(KeyConflict, match="already triggered run"):
        store.runs.create(NewRun("t", key, {"n": 2}, 3, None))


def test_concurrent_triggers_of_one_key_create_one_run(store: Store) -> None:
    key = f"test:{uuid.uuid4()}"
    results: list[tuple[int, bool]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(store.runs.create(NewRun("t", key, {}, 3, None)))
        )
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({run_id for run_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1


def test_split_happens_once_even_when_the_master_runs_twice(store: Store) -> None:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None))
    calls: list[int] = []
    barrier = threading.Barrier(4)

    def plan(run: RunRecord, slots: object) -> list[dict[str, Any]]:
        calls.append(run.id)
        return [{"i": i} for i in range(5)]

    def master() -> None:
        barrier.wait()
        store.runs.split(run_id, plan)

    threads = [threading.Thread(target=master) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [run_id]
    assert store.runs.status(run_id).children.total == 5
    assert store.runs.get(run_id).state is RunState.SPLITTING


def test_dispatch_sends_once_and_resends_after_a_crash(store: Store) -> None:
    run_id = new_run(store, children=3)
    sent: list[tuple[str, list[int]]] = []

    def crash(run: RunRecord, children: list[tuple[int, dict[str, Any]]]) -> None:
        sent.append((str(run.group_id), [i for i, _ in children]))
        raise RuntimeError("master died mid-send")

    with pytest.raises(RuntimeError):
        store.runs.dispatch(run_id, crash)
    assert store.runs.get(run_id).state is RunState.SPLITTING

    def send(run: RunRecord, children: list[tuple[int, dict[str, Any]]]) -> None:
        sent.append((str(run.group_id), [i for i, _ in children]))

    assert store.runs.dispatch(run_id, send) is RunState.RUNNING
    assert store.runs.dispatch(run_id, send) is RunState.RUNNING  # redelivered: no-op
    assert sent == [(f"dtask-{run_id}-1", [0, 1, 2])] * 2
    assert store.runs.get(run_id).group_id == f"dtask-{run_id}-1"


def test_a_plan_error_fails_the_run_with_its_message(store: Store) -> None:
    from dtask.exceptions import InvalidSplit

    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None))

    def bad(run: RunRecord, slots: object) -> list[dict[str, Any]]:
        raise InvalidSplit("no children")

    assert store.runs.split(run_id, bad) is RunState.FAILED
    status = store.runs.status(run_id)
    assert status.error == "no children" and status.finished_at is not None


def test_fencing_rejects_a_stale_owner(store: Store) -> None:
    run_id = new_run(store)
    old = claim(store, run_id, ttl=0.001)
    busy = store.children.claim(run_id, 1, "other", 30)
    assert isinstance(busy, Claim)  # other children are unaffected
    import time

    time.sleep(0.05)  # the old owner's lease expires
    new = claim(store, run_id)
    assert new.fence == old.fence + 1 and new.attempt == 2
    with pytest.raises(LeaseLost):
        store.children.checkpoint(old, {"done": 5}, 30)
    with pytest.raises(LeaseLost):
        store.children.finish(old, None)
    store.children.checkpoint(new, {"done": 7}, 30)
    store.children.finish(new, {"done": 9})
    assert store.runs.status(run_id).children.succeeded == 1


def test_a_live_lease_is_not_taken_and_a_done_child_is_reported_again(store: Store) -> None:
    run_id = new_run(store)
    first = claim(store, run_id)
    refused = store.children.claim(run_id, 0, "dup", 30)
    assert isinstance(refused, Refusal) and refused.reason is ClaimRefusal.BUSY
    store.children.finish(first, None)
    again = store.children.claim(run_id, 0, "dup", 30)
    assert isinstance(again, Refusal) and again.reason is ClaimRefusal.DONE


def test_failed_attempts_retry_then_fail_for_good(store: Store) -> None:
    run_id = new_run(store, max_attempts=2)
    first = claim(store, run_id)
    store.children.checkpoint(first, {"done": 3}, 30)
    assert store.children.fail_attempt(first, "ValueError: one") is ChildState.PENDING
    second = claim(store, run_id)
    assert second.checkpoint == {"done": 3}  # resume, don't restart
    assert store.children.fail_attempt(second, "ValueError: two") is ChildState.FAILED
    refused = store.children.claim(run_id, 0, "late", 30)
    assert isinstance(refused, Refusal) and refused.reason is ClaimRefusal.FAILED
    assert refused.error == "gave up after 2 attempt(s): ValueError: two"


def test_a_child_whose_process_keeps_dying_is_failed_when_attempts_run_out(store: Store) -> None:
    import time

    run_id = new_run(store, max_attempts=2)
    claim(store, run_id, ttl=0.001)
    time.sleep(0.02)
    claim(store, run_id, ttl=0.001)
    time.sleep(0.02)
    refused = store.children.claim(run_id, 0, "third", 30)
    assert isinstance(refused, Refusal) and refused.reason is ClaimRefusal.FAILED
    assert "gave up after 2 attempt(s)" in (refused.error or "")


def test_finalize_waits_for_all_children_and_is_idempotent(store: Store) -> None:
    run_id = new_run(store, children=2)
    store.runs.dispatch(run_id, lambda run, children: None)
    store.children.finish(claim(store, run_id, 0), None)
    assert store.runs.finalize(run_id) is RunState.RUNNING
    c = claim(store, run_id, 1)
    store.children.fail_attempt(c, "boom")
    store.children.fail_attempt(claim(store, run_id, 1), "boom again")
    assert store.runs.finalize(run_id) is RunState.FAILED
    assert store.runs.finalize(run_id) is RunState.FAILED
    status = store.runs.status(run_id)
    assert status.error == "1 child task(s) failed: child 1: gave up after 2 attempt(s): boom again"


def test_unsent_run_can_be_forgotten_and_unknown_runs_are_clear(store: Store) -> None:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None))
    store.runs.forget_unsent(run_id)
    with pytest.raises(RunNotFound, match=f"no run with id {run_id}"):
        store.runs.status(run_id)


def test_statuses_lists_newest_first_with_counts(store: Store) -> None:
    run_id = new_run(store, children=4)
    latest = store.runs.statuses(limit=5)
    assert latest[0].id == run_id and latest[0].children.pending == 4


def test_a_hung_reaper_leader_loses_its_turn_after_hold_for(store: Store) -> None:
    import time

    with pytest.raises(LeaseLost, match="turn ended"), store.recovery.turn(hold_for=0.5) as first:
        assert first
        with store.recovery.turn(hold_for=0.5) as second:
            assert not second  # one leader at a time
        time.sleep(1.5)  # the leader hangs, idle in its transaction: PostgreSQL ends it
        with store.recovery.turn(hold_for=0.5) as third:
            assert third  # a survivor takes over
    with store.recovery.turn(hold_for=0.5) as again:
        assert again


def failed_run(store: Store) -> int:
    """A run of two children: child 0 succeeded, child 1 failed for good; finalized."""
    run_id = new_run(store, children=2)
    store.runs.dispatch(run_id, lambda run, children: None)
    store.children.finish(claim(store, run_id, 0), None)
    store.children.fail_attempt(claim(store, run_id, 1), "boom")
    store.children.fail_attempt(claim(store, run_id, 1), "boom again")
    assert store.runs.finalize(run_id) is RunState.FAILED
    return run_id


def test_a_late_finalize_of_the_old_chord_does_not_end_a_rerun(store: Store) -> None:
    run_id = failed_run(store)
    assert store.runs.rerun(run_id) is RunState.SPLITTING
    # the first chord's callback delivered again (acks_late, a worker died after running it)
    assert store.runs.finalize(run_id) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, children: None) is RunState.RUNNING
    assert store.runs.finalize(run_id) is RunState.RUNNING
    store.children.finish(claim(store, run_id, 1), None)
    assert store.runs.finalize(run_id) is RunState.SUCCEEDED
    assert store.runs.status(run_id).error is None


def test_finalize_racing_a_rerun_says_what_it_did_and_the_run_still_ends(store: Store) -> None:
    """A run is cancelled while child 1 is finishing; its owner's finish, the old chord's
    finalize and a rerun then race. Whichever takes the run's lock first, finalize reports the
    state the run is really in, and the rerun's chord ends the run succeeded."""
    for _ in range(20):
        run_id = new_run(store, children=2)
        store.runs.dispatch(run_id, lambda run, children: None)
        store.children.finish(claim(store, run_id, 0), None)
        finishing = claim(store, run_id, 1)
        assert store.runs.cancel(run_id) is RunState.CANCELLED
        start = threading.Barrier(2)
        reported: list[RunState] = []

        def finish_then_finalize(
            run_id: int, finishing: Claim, start: threading.Barrier, reported: list[RunState]
        ) -> None:
            start.wait()
            store.children.finish(finishing, None)
            reported.append(store.runs.finalize(run_id))

        racer = threading.Thread(
            target=finish_then_finalize, args=(run_id, finishing, start, reported)
        )
        racer.start()
        start.wait()
        store.runs.rerun(run_id)
        racer.join()
        assert store.runs.status(run_id).state is RunState.SPLITTING
        assert reported[0] in (RunState.CANCELLED, RunState.SPLITTING)  # before or after rerun
        store.runs.dispatch(run_id, lambda run, children: None)
        assert store.runs.finalize(run_id) is RunState.SUCCEEDED


def test_a_reduce_runs_with_no_lock_held_and_a_cancel_meanwhile_wins(store: Store) -> None:
    """User code (the template's reduce) runs between finalize's transactions: the run's lock
    is free meanwhile, so a cancel goes through, and finalize then leaves the run cancelled."""
    from dtask.db.database import lock_run

    run_id = new_run(store, children=2)
    store.runs.dispatch(run_id, lambda run, children: None)
    for index in (0, 1):
        store.children.finish(claim(store, run_id, index), None, json.dumps(index + 1))
    seen: list[object] = []

    def reduce(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
        seen.append(load())
        with store.db.tx() as conn:  # another session takes the run's lock at once
            seen.append(lock_run(conn, run_id, wait=False))
        assert store.runs.cancel(run_id) is RunState.CANCELLED
        return json.dumps(sum(load()))

    assert store.runs.finalize(run_id, reduce=reduce) is RunState.CANCELLED
    assert seen == [[1, 2], True]
    assert store.runs.status(run_id).result is None


def test_a_reduce_makes_the_result_and_its_error_fails_the_run(store: Store) -> None:
    def summed(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
        return json.dumps(sum(load()))

    def broken(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
        raise InvalidResult("reduce of template 't' raised ValueError: no")

    for reduce, state, result, error in (
        (summed, RunState.SUCCEEDED, 3, None),
        (broken, RunState.FAILED, None, "reduce of template 't' raised ValueError: no"),
    ):
        run_id = new_run(store, children=2)
        store.runs.dispatch(run_id, lambda run, children: None)
        for index in (0, 1):
            store.children.finish(claim(store, run_id, index), None, json.dumps(index + 1))
        assert store.runs.finalize(run_id, reduce=reduce) is state
        status = store.runs.status(run_id)
        assert (status.result, status.error) == (result, error)
