"""Every branch of a claimed child's attempt (dtask/worker/attempt.py ``Attempt``) against the
in-memory store (tests/support/memory.py, held to the real store's rules by tests/contract):
no PostgreSQL, no broker, milliseconds.

The real-process versions of these paths are in tests/acceptance (faults, drain, cap)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import pytest
from celery import Task
from celery.exceptions import Ignore

import dtask
from dtask.db import Claim
from dtask.domain.runs import ChildState
from dtask.domain.templates import Template, TemplateOptions, registry
from dtask.exceptions import ChildFailed, DatabaseUnavailable, LeaseLost
from dtask.settings import Settings
from dtask.worker import drain
from dtask.worker.attempt import Attempt
from dtask.worker.tasks import OwnMessage
from tests.support.memory import MemoryStore, Sent, install

CONFIG = Settings(lease_ttl=1.0, heartbeat_interval=0.1, retry_delay=0.0, execution_cap_grace=60)


class Retried(Exception):
    pass


class FakeTask:
    def __init__(self) -> None:
        self.retries: list[dict[str, Any]] = []

    def retry(self, **options: Any) -> Exception:
        self.retries.append(options)
        return Retried()


Body = Callable[[dtask.ChildContext, MemoryStore], None]
_bodies: dict[str, Body] = {}
RUN = 1  # the only run, of one child (index 0), of 2 attempts


def template(body: Body, execution_cap: float | None = None) -> str:
    name = f"lifecycle_{body.__name__}_{len(_bodies)}"
    _bodies[name] = body
    registry.add(
        Template(
            name=name,
            params={},
            skeleton={},
            split=lambda rendered: [{"n": 10}],
            function=lambda ctx, n: body(ctx, STORE[0]),
            options=TemplateOptions(
                checkpoint_every=1, checkpoint_interval=3600, execution_cap=execution_cap
            ),
        )
    )
    return name


STORE: list[MemoryStore] = []
SENT: list[Sent] = []


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    memory = MemoryStore()
    assert memory.runs.add("lifecycle", [{"n": 10}], max_attempts=2) == RUN
    memory.runs.dispatch(RUN, lambda run, children: None)
    STORE[:], SENT[:] = [memory], [install(monkeypatch, memory, CONFIG)]
    return memory


def run(
    store: MemoryStore, name: str, task: FakeTask | None = None, config: Settings = CONFIG
) -> None:
    """What ``Received.one`` does with a claimed child: run it, then finalize if it was last."""
    store.tables.runs[RUN].template = name  # the run is of the template under test
    claim = store.children.claim(RUN, 0, "me", config.lease_ttl)
    assert isinstance(claim, Claim)
    own = OwnMessage(cast(Task, task or FakeTask()), RUN, 0, name, {"n": 10})
    Attempt(own, own.children[0], claim, config, time.monotonic()).run()
    own.finalize(own.children[0])


def writes(store: MemoryStore) -> list[str]:
    """The child's owner writes that went through under its fence, in order."""
    return [what for what, _ in store.children.written]


def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def works(ctx: dtask.ChildContext, store: MemoryStore) -> None:
    for _ in ctx.resume(range(10)):
        pass


def test_a_child_that_works_finishes_under_its_fence(store: MemoryStore) -> None:
    run(store, template(works))
    child = store.row(RUN, 0)
    assert child.state is ChildState.SUCCEEDED
    assert child.checkpoint == {"done": 10}
    assert writes(store)[-1] == "finish"
    assert store.runs.finalized == [RUN]  # the run's last child finalizes it


def test_a_retried_attempt_does_not_finalize_the_run(store: MemoryStore) -> None:
    def raises(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        raise ValueError("once")

    with pytest.raises(Retried):
        run(store, template(raises))
    assert store.runs.finalized == []


def test_claim_lost_the_heartbeat_is_refused_and_the_next_step_stops(store: MemoryStore) -> None:
    def loses_its_claim(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        for i in ctx.resume(range(10)):
            if i == 3:
                store.take_over(RUN, 0)
                until(ctx.should_stop)  # the heartbeat saw the fence move

    with pytest.raises(LeaseLost):
        run(store, template(loses_its_claim))
    assert store.row(RUN, 0).state is ChildState.RUNNING  # the new owner's, untouched
    assert "finish" not in writes(store) and "release" not in writes(store)


def test_lease_lost_mid_checkpoint_nothing_more_is_written(store: MemoryStore) -> None:
    def hook(claim: Claim) -> None:
        if store.row(RUN, 0).checkpoint == {"done": 4}:
            store.take_over(RUN, 0)

    store.children.before["checkpoint"] = hook
    with pytest.raises(LeaseLost):
        run(store, template(works))
    assert store.row(RUN, 0).checkpoint == {"done": 4}
    assert writes(store).count("checkpoint") == 4
    assert store.row(RUN, 0).state is ChildState.RUNNING


def test_lease_lost_at_finish(store: MemoryStore) -> None:
    def done_then_taken(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        works(ctx, store)
        store.take_over(RUN, 0)

    with pytest.raises(LeaseLost):
        run(store, template(done_then_taken))
    assert "finish" not in writes(store)


def test_cancel_mid_run_releases_the_child_at_its_checkpoint(store: MemoryStore) -> None:
    def cancelled_at_3(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        for i in ctx.resume(range(10)):
            if i == 3:
                store.runs.cancel(RUN)
                until(ctx.should_stop)

    with pytest.raises(Ignore):
        run(store, template(cancelled_at_3))
    c = store.row(RUN, 0)
    assert (c.state, c.attempt, c.checkpoint) == (ChildState.PENDING, 0, {"done": 4})
    assert writes(store)[-1] == "release"
    assert SENT[0].published == []  # and no message: the run is not active


def test_cancel_during_finish_the_finished_work_counts(store: MemoryStore) -> None:
    def cancelled_as_it_returns(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        works(ctx, store)
        store.runs.cancel(RUN)

    run(store, template(cancelled_as_it_returns))
    assert store.row(RUN, 0).state is ChildState.SUCCEEDED


def test_an_exception_fails_the_attempt_and_retries_from_the_checkpoint(store: MemoryStore) -> None:
    def raises_at_5(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        for i in ctx.resume(range(10)):
            if i == 5:
                raise KeyError("x")

    task = FakeTask()
    with pytest.raises(Retried):
        run(store, template(raises_at_5), task)
    c = store.row(RUN, 0)
    assert (c.state, c.attempt, c.checkpoint) == (ChildState.PENDING, 1, {"done": 5})
    assert c.error == "KeyError: 'x'" and len(task.retries) == 1


def test_the_last_failed_attempt_fails_the_child(store: MemoryStore) -> None:
    def always_raises(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        raise ValueError("bad")

    store.row(RUN, 0).attempt = 1  # this is attempt 2 of 2
    with pytest.raises(ChildFailed, match=r"gave up after 2 attempt\(s\): ValueError: bad"):
        run(store, template(always_raises))
    assert store.row(RUN, 0).state is ChildState.FAILED
    assert store.runs.finalized == [RUN]


def test_over_its_execution_cap_a_stepping_child_fails_its_attempt(store: MemoryStore) -> None:
    def spins(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        while True:
            ctx.checkpoint(ctx.checkpoint_state)
            time.sleep(0.01)

    with pytest.raises(Retried):
        run(store, template(spins, execution_cap=0.1))
    c = store.row(RUN, 0)
    assert c.state is ChildState.PENDING and c.attempt == 1
    assert c.error == "run 1 child 0 attempt 1 exceeded its execution cap of 0.1 s"


@pytest.mark.parametrize(("template_cap", "seen"), [(None, "0.1"), (0.2, "0.2")])
def test_the_default_execution_cap_holds_where_no_template_or_run_sets_one(
    store: MemoryStore, template_cap: float | None, seen: str
) -> None:
    def spins(ctx: dtask.ChildContext, store: MemoryStore) -> None:
        while True:
            ctx.checkpoint(ctx.checkpoint_state)
            time.sleep(0.01)

    capped = CONFIG.model_copy(update={"default_execution_cap": 0.1})
    with pytest.raises(Retried):
        run(store, template(spins, execution_cap=template_cap), config=capped)
    error = store.row(RUN, 0).error
    assert error == f"run 1 child 0 attempt 1 exceeded its execution cap of {seen} s"


def test_a_draining_worker_that_cannot_reach_postgresql_retries_its_child(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``dtask.child`` arriving while its worker drains is handed over; where PostgreSQL
    cannot say whether its run is active, its message is tried again after a lease, not
    failed (a failed task's message is acked: the child would wait for the stall timeout)."""

    def unreachable(run_id: int) -> None:
        raise DatabaseUnavailable("PostgreSQL is away")

    monkeypatch.setattr(store.runs, "get", unreachable)
    task = FakeTask()
    drain.DRAINING.set()
    try:
        with pytest.raises(Retried):
            OwnMessage(cast(Task, task), RUN, 0, template(works), {"n": 10}).run()
    finally:
        drain.DRAINING.clear()
    assert [r["countdown"] for r in task.retries] == [CONFIG.lease_ttl]
    assert store.row(RUN, 0).state is ChildState.PENDING  # not claimed
