"""The dispatcher's store against a real PostgreSQL: deferred children, taking them in order,
the unsent count, a rerun's children waiting again, one pass at a time."""

from __future__ import annotations

import uuid

import pytest

from dtask import services
from dtask.db import Claim, Store
from dtask.domain.runs import RunState


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def deferred_run(store: Store, children: int) -> int:
    run_id, _ = store.runs.create("t", f"test:{uuid.uuid4()}", {}, 1, None)
    plan = [{"i": i} for i in range(children)]
    assert store.runs.split(run_id, lambda run: plan, deferred=True) is RunState.SPLITTING
    sizes: list[int] = []
    state = store.runs.dispatch(run_id, lambda run, kids: sizes.append(len(kids)), deferred=True)
    assert (state, sizes) == (RunState.RUNNING, [0])  # the chord is fixed, nothing is sent
    return run_id


def unsent(store: Store, run_id: int) -> int:
    with store.dispatch.turn() as turn:
        assert turn is not None
        return next(d.unsent for ds in turn.demands().values() for d in ds if d.run_id == run_id)


def test_deferred_children_are_taken_in_order_and_counted(store: Store) -> None:
    run_id = deferred_run(store, 5)
    assert unsent(store, run_id) == 5
    with store.dispatch.turn() as turn:
        assert turn is not None
        before = turn.out()[0].get(None)
        assert [c.index for c in turn.take(run_id, 3)] == [0, 1, 2]
        after = turn.out()[0][None]
        assert after.queued - (before.queued if before else 0) == 3
    assert unsent(store, run_id) == 2
    with store.dispatch.turn() as turn:
        assert turn is not None
        assert [c.index for c in turn.take(run_id, 10)] == [3, 4]
        assert run_id not in {d.run_id for ds in turn.demands().values() for d in ds}


def test_one_pass_at_a_time(store: Store) -> None:
    with store.dispatch.turn() as first:
        assert first is not None
        with store.dispatch.turn() as second:
            assert second is None


def test_a_rerun_s_children_wait_for_the_dispatcher_again(store: Store) -> None:
    run_id = deferred_run(store, 2)
    with store.dispatch.turn() as turn:
        assert turn is not None
        turn.take(run_id, 2)
    for index in (0, 1):
        claim = store.children.claim(run_id, index, "me", 30)
        assert isinstance(claim, Claim)
        store.children.fail_attempt(claim, "boom")  # one attempt only: failed for good
    assert store.runs.finalize(run_id) is RunState.FAILED
    assert store.runs.rerun(run_id) is RunState.SPLITTING
    store.runs.dispatch(run_id, lambda run, kids: None, deferred=True)
    assert unsent(store, run_id) == 2
