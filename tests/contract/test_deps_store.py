"""Dependencies' contract (dtask/db/deps.py through ``store.runs`` and ``store.recovery``): a
run submitted after others waits, is released exactly when its last upstream succeeds, and
fails with its whole downstream when an upstream fails or is cancelled; a rerun, a resubmit,
a missing upstream, the reaper's settling of a run nobody settled, the graph. Run on both
stores (conftest.py); the races between upstreams finishing at once, a dependent submitted
while its upstream finishes, and a cancel's locks stay on PostgreSQL alone
(tests/integration/test_deps.py)."""

from __future__ import annotations

import uuid

import pytest

from dtask.domain.runs import RunState
from dtask.exceptions import KeyConflict, UpstreamFailed, UpstreamNotFound
from tests.contract.worlds import World


def create(world: World, after: tuple[int, ...] = (), key: str | None = None) -> int:
    return world.submit(after=after, key=key)


def running(world: World, after: tuple[int, ...] = ()) -> int:
    """A run of one child, dispatched (its upstreams, if any, have succeeded)."""
    run_id = create(world, after)
    assert world.runs.split(run_id, lambda run, slots: [{"i": 0}]) is RunState.SPLITTING
    world.runs.dispatch(run_id, lambda run, children: None)
    return run_id


def finish(world: World, run_id: int, ok: bool = True) -> list[int]:
    """Its child succeeds (or fails both attempts), then its run is finalized: the dependents
    that released."""
    taken = world.claim(run_id)
    if ok:
        world.children.finish(taken, None)
    else:
        world.children.fail_attempt(taken, "boom")
        world.children.fail_attempt(world.claim(run_id), "boom again")
    released: list[int] = []
    world.runs.finalize(run_id, released=released)
    return released


def test_a_run_waits_for_its_upstreams_and_is_released_by_the_last(world: World) -> None:
    b, c = running(world), running(world)
    d = create(world, (b, c))
    status = world.runs.status(d)
    assert status.state is RunState.WAITING
    assert (status.after, status.waiting_for) == ((b, c), (b, c))
    never_early = world.runs.split(d, lambda run, slots: [{"i": 0}])
    assert never_early is RunState.WAITING  # never split early
    assert finish(world, b) == []
    assert world.runs.status(d).waiting_for == (c,)
    assert finish(world, c) == [d]
    assert world.state(d) is RunState.PENDING
    assert create(world, (b, c)) and world.state(create(world, (b,))) is RunState.PENDING


def test_one_failed_upstream_fails_a_dependent_whose_others_succeeded(world: World) -> None:
    ok, bad = running(world), running(world)
    d = create(world, (ok, bad))
    assert finish(world, ok) == []
    assert finish(world, bad, ok=False) == []
    status = world.runs.status(d)
    assert (status.state, status.error) == (RunState.FAILED, f"upstream run {bad} failed")
    assert status.waiting_for == () and status.finished_at is not None


def test_a_chain_is_released_one_run_at_a_time(world: World) -> None:
    a = running(world)
    b = create(world, (a,))
    c = create(world, (b,))
    assert finish(world, a) == [b]
    assert (world.state(b), world.state(c)) == (RunState.PENDING, RunState.WAITING)
    assert world.runs.split(b, lambda run, slots: [{"i": 0}]) is RunState.SPLITTING
    world.runs.dispatch(b, lambda run, children: None)
    assert finish(world, b) == [c]
    assert world.state(c) is RunState.PENDING


def test_a_failed_upstream_fails_its_whole_downstream_naming_it(world: World) -> None:
    a = running(world)
    b = create(world, (a,))
    c = create(world, (b,))
    d = create(world, (b, c))
    other = running(world)
    e = create(world, (other, d))
    finish(world, a, ok=False)
    assert world.runs.status(b).error == f"upstream run {a} failed"
    assert world.runs.status(c).error == f"upstream run {b} failed"
    assert world.runs.status(d).error == f"upstream run {b} failed"
    assert world.runs.status(e).error == f"upstream run {d} failed"
    assert {world.state(r) for r in (b, c, d, e)} == {RunState.FAILED}
    assert world.state(other) is RunState.RUNNING
    late = create(world, (a,))  # after a run that already failed: failed at once
    assert world.runs.status(late).error == f"upstream run {a} failed"


def test_a_cancelled_upstream_fails_its_dependents_and_a_rerun_chain_recovers(
    world: World,
) -> None:
    a = running(world)
    b = create(world, (a,))
    assert world.runs.cancel(a) is RunState.CANCELLED
    assert world.runs.status(b).error == f"upstream run {a} was cancelled"
    with pytest.raises(UpstreamFailed, match=rf"rerun that one first \(dtask rerun {a}\)"):
        world.runs.rerun(b)
    assert world.runs.rerun(a) is RunState.SPLITTING
    assert world.runs.rerun(b) is RunState.WAITING  # its upstream runs again
    world.runs.dispatch(a, lambda run, children: None)
    assert finish(world, a) == [b]


def test_cancelling_a_waiting_run_fails_its_dependents(world: World) -> None:
    a = running(world)
    b = create(world, (a,))
    c = create(world, (b,))
    assert world.runs.cancel(b) is RunState.CANCELLED
    assert world.runs.status(c).error == f"upstream run {b} was cancelled"
    assert finish(world, a) == []


def test_a_missing_upstream_is_refused_and_nothing_is_written(world: World) -> None:
    key = f"test:{uuid.uuid4()}"
    with pytest.raises(UpstreamNotFound, match="after: no run with id 999999999"):
        create(world, (999_999_999,), key=key)
    with pytest.raises(UpstreamNotFound, match="no run with the key 'no-such-key'"):
        world.runs.ids_by_key(["no-such-key"])
    up = running(world)
    assert create(world, (up,), key=key)  # the key was not taken by the refused submit


def test_a_resubmit_returns_the_same_run_only_with_the_same_upstreams(world: World) -> None:
    a, b = running(world), running(world)
    key = f"test:{uuid.uuid4()}"
    first = create(world, (a, b), key=key)
    assert create(world, (b, a), key=key) == first
    with pytest.raises(KeyConflict, match=rf"already triggered run {first} with different"):
        create(world, (a,), key=key)
    assert world.runs.ids_by_key([key]) == {key: first}


def test_the_reaper_settles_a_waiting_run_nobody_settled(world: World) -> None:
    """As a worker of an older dtask would leave it: an upstream finished without settling."""
    up, failing = running(world), running(world)
    ok, bad = create(world, (up,)), create(world, (failing,))
    below = create(world, (bad,))
    world.force(up, RunState.SUCCEEDED)
    world.force(failing, RunState.FAILED)
    assert ok in world.recovery.settle_waiting()
    assert world.state(ok) is RunState.PENDING
    assert world.runs.status(bad).error == f"upstream run {failing} failed"
    assert world.runs.status(below).error == f"upstream run {bad} failed"


def test_the_reaper_leaves_a_run_whose_upstream_still_runs(world: World) -> None:
    up = running(world)
    down = create(world, (up,))
    assert down not in world.recovery.settle_waiting()
    assert world.state(down) is RunState.WAITING


def test_graph_of_a_diamond(world: World) -> None:
    a = running(world)
    b, c = create(world, (a,)), create(world, (a,))
    d = create(world, (b, c))
    graph = world.runs.graph(d)
    assert {k: sorted(v) for k, v in graph.upstream.items()} == {d: [b, c], b: [a], c: [a]}
    assert sorted(map(tuple, graph.as_json()["edges"])) == sorted([(b, a), (c, a), (d, b), (d, c)])
    assert world.runs.graph(a).downstream[a] and set(world.runs.graph(a).downstream[a]) == {b, c}


def test_a_run_others_wait_for_is_not_forgotten_when_its_master_cannot_be_sent(
    world: World,
) -> None:
    up = create(world)
    down = create(world, (up,))
    assert world.runs.forget_unsent(up) is False  # kept: the reaper starts it later
    assert world.state(up) is RunState.PENDING and world.state(down) is RunState.WAITING
    alone = create(world)
    assert world.runs.forget_unsent(alone) is True
