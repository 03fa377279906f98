"""Dependencies between runs where PostgreSQL's locks decide, against a real PostgreSQL: a
dependent released exactly once when its upstreams finish at once, or when one finishes while
the dependent is being submitted; failing a downstream while its middle is being cancelled
never deadlocks; a schedule's upstream slot. What a release or a failure does, one step at a
time, is the contract both stores keep (tests/contract/test_deps_store.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from functools import partial

import pytest

from dtask import services, templating
from dtask.db import Claim, Store
from dtask.db.database import sql
from dtask.domain.runs import NewRun, RunState
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
    assert store.runs.split(run_id, lambda run, slots: [{"i": 0}]) is RunState.SPLITTING
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


def test_a_schedule_after_one_of_another_cadence_is_decided_up_to_its_next_slot(
    store: Store,
) -> None:
    """extract at 02:00 and load at 03:00 after it: load's slot must not wait for extract's
    next slot a day later, only for a due one."""
    from datetime import timedelta

    from dtask.client.schedules import add_schedule, remove_schedule
    from dtask.db.schedules import _decided_upstream

    templating.load_templates()
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
