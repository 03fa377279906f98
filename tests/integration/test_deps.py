"""Dependencies between runs in the store, against a real PostgreSQL: a run submitted after
others waits, is released exactly when its last upstream succeeds (even when upstreams finish
at once, or one finishes while the dependent is being submitted), and fails with its whole
downstream when an upstream fails or is cancelled."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial

import pytest

from dtask import services
from dtask.db import Claim, Store
from dtask.db.database import sql
from dtask.domain.runs import NewRun, RunState
from dtask.exceptions import KeyConflict, UpstreamFailed, UpstreamNotFound
from tests.support.db import wait_for


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def create(store: Store, after: tuple[int, ...] = (), key: str | None = None) -> int:
    run_id, _ = store.runs.create(
        NewRun("t", key or f"test:{uuid.uuid4()}", {}, 2, None, after=after)
    )
    return run_id


def running(store: Store, after: tuple[int, ...] = ()) -> int:
    """A run of one child, dispatched (its upstreams, if any, have succeeded)."""
    run_id = create(store, after)
    assert store.runs.split(run_id, lambda run: [{"i": 0}]) is RunState.SPLITTING
    store.runs.dispatch(run_id, lambda run, children: None)
    return run_id


def finish(store: Store, run_id: int, ok: bool = True) -> list[int]:
    taken = store.children.claim(run_id, 0, "me", 30)
    assert isinstance(taken, Claim), taken
    if ok:
        store.children.finish(taken, None)
    else:
        store.children.fail_attempt(taken, "boom")
        again = store.children.claim(run_id, 0, "me", 30)
        assert isinstance(again, Claim)
        store.children.fail_attempt(again, "boom again")
    released: list[int] = []
    store.runs.finalize(run_id, released=released)
    return released


def state(store: Store, run_id: int) -> RunState:
    return store.runs.status(run_id).state


def test_a_run_waits_for_its_upstreams_and_is_released_by_the_last(store: Store) -> None:
    b, c = running(store), running(store)
    d = create(store, (b, c))
    status = store.runs.status(d)
    assert status.state is RunState.WAITING
    assert (status.after, status.waiting_for) == ((b, c), (b, c))
    assert store.runs.split(d, lambda run: [{"i": 0}]) is RunState.WAITING  # never split early
    assert finish(store, b) == []
    assert store.runs.status(d).waiting_for == (c,)
    assert finish(store, c) == [d]
    assert state(store, d) is RunState.PENDING
    assert create(store, (b, c)) and state(store, create(store, (b,))) is RunState.PENDING


def at_once(*actions: Callable[[], object]) -> list[object]:
    """Run ``actions`` in threads released together; their results in order."""
    start = threading.Barrier(len(actions))
    results: list[object] = [None] * len(actions)

    def run(i: int) -> None:
        start.wait()
        results[i] = actions[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_upstreams_finishing_at_once_release_their_dependent_exactly_once(store: Store) -> None:
    for _ in range(15):
        ups = [running(store) for _ in range(4)]
        d = create(store, tuple(ups))
        released = at_once(*(partial(finish, store, u) for u in ups))
        assert sorted(r for rs in released for r in rs) == [d]  # type: ignore[attr-defined]
        assert state(store, d) is RunState.PENDING


def test_a_dependent_submitted_while_its_upstream_finishes_never_waits_for_ever(
    store: Store,
) -> None:
    for _ in range(15):
        up = running(store)
        made, released = at_once(partial(create, store, (up,)), partial(finish, store, up))
        # either created after the success (pending at once) or released by it
        assert state(store, made) is RunState.PENDING  # type: ignore[arg-type]
        assert released in ([], [made])


def test_a_failed_upstream_fails_its_whole_downstream_naming_it(store: Store) -> None:
    a = running(store)
    b = create(store, (a,))
    c = create(store, (b,))
    d = create(store, (b, c))
    other = running(store)
    e = create(store, (other, d))
    finish(store, a, ok=False)
    assert store.runs.status(b).error == f"upstream run {a} failed"
    assert store.runs.status(c).error == f"upstream run {b} failed"
    assert store.runs.status(d).error == f"upstream run {b} failed"
    assert store.runs.status(e).error == f"upstream run {d} failed"
    assert {state(store, r) for r in (b, c, d, e)} == {RunState.FAILED}
    assert state(store, other) is RunState.RUNNING
    late = create(store, (a,))  # after a run that already failed: failed at once
    assert store.runs.status(late).error == f"upstream run {a} failed"


def test_a_cancelled_upstream_fails_its_dependents_and_a_rerun_chain_recovers(
    store: Store,
) -> None:
    a = running(store)
    b = create(store, (a,))
    assert store.runs.cancel(a) is RunState.CANCELLED
    assert store.runs.status(b).error == f"upstream run {a} was cancelled"
    with pytest.raises(UpstreamFailed, match=rf"rerun that one first \(dtask rerun {a}\)"):
        store.runs.rerun(b)
    assert store.runs.rerun(a) is RunState.SPLITTING
    assert store.runs.rerun(b) is RunState.WAITING  # its upstream runs again
    store.runs.dispatch(a, lambda run, children: None)
    assert finish(store, a) == [b]


def test_cancelling_a_waiting_run_fails_its_dependents(store: Store) -> None:
    a = running(store)
    b = create(store, (a,))
    c = create(store, (b,))
    assert store.runs.cancel(b) is RunState.CANCELLED
    assert store.runs.status(c).error == f"upstream run {b} was cancelled"
    assert finish(store, a) == []


def test_a_missing_upstream_is_refused_and_nothing_is_written(store: Store) -> None:
    key = f"test:{uuid.uuid4()}"
    with pytest.raises(UpstreamNotFound, match="after: no run with id 999999999"):
        create(store, (999_999_999,), key=key)
    with pytest.raises(UpstreamNotFound, match="no run with the key 'no-such-key'"):
        store.runs.ids_by_key(["no-such-key"])
    up = running(store)
    assert create(store, (up,), key=key)  # the key was not taken by the refused submit


def test_a_resubmit_returns_the_same_run_only_with_the_same_upstreams(store: Store) -> None:
    a, b = running(store), running(store)
    key = f"test:{uuid.uuid4()}"
    first = create(store, (a, b), key=key)
    assert create(store, (b, a), key=key) == first
    with pytest.raises(KeyConflict, match=rf"already triggered run {first} with another upstream"):
        create(store, (a,), key=key)


def test_the_reaper_settles_a_waiting_run_nobody_settled(store: Store) -> None:
    """As a worker of an older dtask would leave it: an upstream finished without settling."""
    up, failing = running(store), running(store)
    ok, bad = create(store, (up,)), create(store, (failing,))
    below = create(store, (bad,))
    with store.runs.db.tx() as conn:
        conn.execute(sql("UPDATE dtask_runs SET state = 'succeeded' WHERE id = :id"), {"id": up})
        conn.execute(sql("UPDATE dtask_runs SET state = 'failed' WHERE id = :id"), {"id": failing})
    assert ok in store.recovery.settle_waiting()
    assert state(store, ok) is RunState.PENDING
    assert store.runs.status(bad).error == f"upstream run {failing} failed"
    assert store.runs.status(below).error == f"upstream run {bad} failed"


def test_graph_of_a_diamond(store: Store) -> None:
    a = running(store)
    b, c = create(store, (a,)), create(store, (a,))
    d = create(store, (b, c))
    graph = store.runs.graph(d)
    assert {k: sorted(v) for k, v in graph.upstream.items()} == {d: [b, c], b: [a], c: [a]}
    assert sorted(map(tuple, graph.as_json()["edges"])) == sorted([(b, a), (c, a), (d, b), (d, c)])
    assert store.runs.graph(a).downstream[a] and set(store.runs.graph(a).downstream[a]) == {b, c}


def test_failing_a_downstream_while_its_middle_is_being_cancelled_never_deadlocks(
    store: Store,
) -> None:
    """X <- B <- C <- D, and D after X too. A cancel of C holds C and then wants D; failing X
    must not hold D while it waits for C: the whole waiting downstream is locked in id order."""
    x = running(store)
    b = create(store, (x,))
    c = create(store, (b,))
    d = create(store, (c, x))
    errors: list[BaseException] = []

    def fail_x() -> None:
        try:
            finish(store, x, ok=False)
        except BaseException as exc:
            errors.append(exc)

    with store.db.engine.connect() as cancel:  # what a cancel of C holds, then wants
        with cancel.begin():
            cancel.execute(sql("SELECT 1 FROM dtask_runs WHERE id = :c FOR UPDATE"), {"c": c})
            failing = threading.Thread(target=fail_x)
            failing.start()
            wait_for(lambda: lock_waiters(store) > 0, 30, "failing X to wait for C's lock")
            cancel.execute(sql("SELECT 1 FROM dtask_runs WHERE id = :d FOR UPDATE"), {"d": d})
        failing.join(60)
    assert errors == []
    assert [state(store, r) for r in (b, c, d)] == [RunState.FAILED] * 3


def lock_waiters(store: Store) -> int:
    with store.db.tx() as conn:
        return int(
            conn.execute(
                sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                )
            ).scalar_one()
        )


def test_a_run_others_wait_for_is_not_forgotten_when_its_master_cannot_be_sent(
    store: Store,
) -> None:
    up = create(store)
    down = create(store, (up,))
    assert store.runs.forget_unsent(up) is False  # kept: the reaper starts it later
    assert state(store, up) is RunState.PENDING and state(store, down) is RunState.WAITING
    alone = create(store)
    assert store.runs.forget_unsent(alone) is True


def test_a_schedule_after_one_of_another_cadence_is_decided_up_to_its_next_slot(
    store: Store,
) -> None:
    """extract at 02:00 and load at 03:00 after it: load's slot must not wait for extract's
    next slot a day later, only for a due one."""
    from datetime import timedelta

    from dtask.client.schedules import add_schedule, remove_schedule
    from dtask.db.schedules import _decided_upstream

    services.load_templates()
    name = f"up-{uuid.uuid4().hex[:6]}"
    add_schedule(name, "print_range", {"n": 1}, every=3600)
    try:
        with store.db.tx() as conn:
            now = conn.execute(sql("SELECT now()")).scalar_one()
            assert _decided_upstream(conn, name, now) == now  # its next slot is later
            conn.execute(
                sql(
                    "UPDATE dtask_schedules SET decided_until = now() - interval '2 hours',"
                    " next_due_at = now() WHERE name = :n"
                ),
                {"n": name},
            )
            held = _decided_upstream(conn, name, now)
            assert now - timedelta(hours=2) < held < now  # just before its due, undecided slot
            assert held.minute == 59 and held.second == 59
    finally:
        remove_schedule(name)
