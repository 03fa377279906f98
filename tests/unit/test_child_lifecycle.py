"""Every branch of a claimed child's lifecycle (dtask/worker/attempt.py ``Attempt``) against
a fake store with the real store's fence rules: no PostgreSQL, no broker, milliseconds.

The real-process versions of these paths are in tests/acceptance (faults, drain, cap)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery.exceptions import Ignore

import dtask
from dtask.db import Claim, RunRecord
from dtask.domain.runs import ChildState, RunState
from dtask.domain.templates import Template, TemplateOptions, registry
from dtask.exceptions import ChildFailed, LeaseLost
from dtask.settings import Settings
from dtask.worker.attempt import Attempt
from dtask.worker.tasks import OwnMessage

CONFIG = Settings(lease_ttl=1.0, heartbeat_interval=0.1, retry_delay=0.0, execution_cap_grace=60)


@dataclass
class FakeChildren:
    """One child (run 1, index 0) under the real store's rules: every owner write is
    conditional on ``state = 'running' AND fence = :mine`` and raises LeaseLost otherwise."""

    run_state: RunState = RunState.RUNNING
    state: ChildState = ChildState.PENDING
    fence: int = 0
    attempt: int = 0
    max_attempts: int = 2
    checkpoint_state: Any = None
    last_error: str | None = None
    writes: list[str] = field(default_factory=list)
    result: str | None = None
    on_checkpoint: Callable[[FakeChildren], None] | None = None

    def claim(self) -> Claim:
        assert self.state is ChildState.PENDING
        self.state, self.fence, self.attempt = ChildState.RUNNING, self.fence + 1, self.attempt + 1
        return Claim(
            1, self.fence, self.attempt, self.max_attempts, {"n": 10}, self.checkpoint_state
        )

    def taken_over(self) -> None:
        """Another worker claims the child (its lease looked expired): the fence moves."""
        self.fence += 1

    def _owned(self, claim: Claim, what: str) -> None:
        if self.state is not ChildState.RUNNING or self.fence != claim.fence:
            raise LeaseLost(f"fence {claim.fence} is stale")
        self.writes.append(what)

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None:
        if self.state is not ChildState.RUNNING or self.fence != claim.fence:
            return None
        return self.run_state

    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(self)
        self._owned(claim, "checkpoint")
        self.checkpoint_state = state

    def finish(self, claim: Claim, final_checkpoint: Any | None, result: str | None = None) -> None:
        self._owned(claim, "finish")
        self.result = result
        self.state = ChildState.SUCCEEDED
        if final_checkpoint is not None:
            self.checkpoint_state = final_checkpoint

    def release(self, claim: Claim, checkpoint: Any | None) -> None:
        self._owned(claim, "release")
        self.state, self.attempt = ChildState.PENDING, self.attempt - 1

    def fail_attempt(
        self, claim: Claim, error: str, traceback: str | None = None, output: str | None = None
    ) -> ChildState:
        self._owned(claim, "fail_attempt")
        last = self.attempt >= self.max_attempts
        self.state = ChildState.FAILED if last else ChildState.PENDING
        self.last_error = f"gave up after {self.attempt} attempt(s): {error}" if last else error
        return self.state

    def error(self, run_id: int, index: int) -> str | None:
        return self.last_error

    def any_unfinished(self, run_id: int) -> bool:
        return self.state in (ChildState.PENDING, ChildState.RUNNING)


class FakeRuns:
    def __init__(self, children: FakeChildren) -> None:
        self._children = children
        self.finalized: list[int] = []

    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Any = None,
        released: Any = None,
        ended: Any = None,
        reduces: Any = None,
    ) -> RunState:
        self.finalized.append(run_id)
        return RunState.SUCCEEDED

    def get(self, run_id: int) -> RunRecord:
        return RunRecord(1, "t", "k", {}, self._children.run_state, 2, None, 1, "dtask-1-1", 1, 1)


class FakeStore:
    def __init__(self) -> None:
        self.children = FakeChildren()
        self.runs = FakeRuns(self.children)


class Retried(Exception):
    pass


class FakeTask:
    def __init__(self) -> None:
        self.retries: list[dict[str, Any]] = []

    def retry(self, **options: Any) -> Exception:
        self.retries.append(options)
        return Retried()


Body = Callable[[dtask.ChildContext, FakeChildren], None]
_bodies: dict[str, Body] = {}


def template(body: Body, execution_cap: float | None = None) -> str:
    name = f"lifecycle_{body.__name__}_{len(_bodies)}"
    _bodies[name] = body
    registry.add(
        Template(
            name=name,
            params={},
            skeleton={},
            split=lambda rendered: [{"n": 10}],
            function=lambda ctx, n: body(ctx, STORE[0].children),
            options=TemplateOptions(
                checkpoint_every=1, checkpoint_interval=3600, execution_cap=execution_cap
            ),
        )
    )
    return name


STORE: list[FakeStore] = []


@pytest.fixture
def store() -> Iterator[FakeStore]:
    STORE[:] = [FakeStore()]
    yield STORE[0]


def run(store: FakeStore, name: str, task: FakeTask | None = None) -> None:
    """What ``run_child`` does with a claimed child: run it, then finalize if it was last."""
    claim = store.children.claim()
    delivery = OwnMessage(task or FakeTask(), 1, 0, name, {"n": 10})  # type: ignore[arg-type]
    Attempt(delivery, store, claim, CONFIG, time.monotonic()).run()  # type: ignore[arg-type]
    delivery.finalize(store)  # type: ignore[arg-type]


def until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def works(ctx: dtask.ChildContext, child: FakeChildren) -> None:
    for _ in ctx.resume(range(10)):
        pass


def test_a_child_that_works_finishes_under_its_fence(store: FakeStore) -> None:
    run(store, template(works))
    assert store.children.state is ChildState.SUCCEEDED
    assert store.children.checkpoint_state == {"done": 10}
    assert store.children.writes[-1] == "finish"
    assert store.runs.finalized == [1]  # the run's last child finalizes it


def test_a_retried_attempt_does_not_finalize_the_run(store: FakeStore) -> None:
    def raises(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        raise ValueError("once")

    with pytest.raises(Retried):
        run(store, template(raises))
    assert store.runs.finalized == []


def test_claim_lost_the_heartbeat_is_refused_and_the_next_step_stops(store: FakeStore) -> None:
    def loses_its_claim(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        for i in ctx.resume(range(10)):
            if i == 3:
                child.taken_over()
                until(ctx.should_stop)  # the heartbeat saw the fence move

    with pytest.raises(LeaseLost):
        run(store, template(loses_its_claim))
    assert store.children.state is ChildState.RUNNING  # the new owner's, untouched
    assert "finish" not in store.children.writes and "release" not in store.children.writes


def test_lease_lost_mid_checkpoint_nothing_more_is_written(store: FakeStore) -> None:
    def hook(child: FakeChildren) -> None:
        if child.checkpoint_state == {"done": 4}:
            child.taken_over()

    store.children.on_checkpoint = hook
    with pytest.raises(LeaseLost):
        run(store, template(works))
    assert store.children.checkpoint_state == {"done": 4}
    assert store.children.writes.count("checkpoint") == 4
    assert store.children.state is ChildState.RUNNING


def test_lease_lost_at_finish(store: FakeStore) -> None:
    def done_then_taken(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        works(ctx, child)
        child.taken_over()

    with pytest.raises(LeaseLost):
        run(store, template(done_then_taken))
    assert "finish" not in store.children.writes


def test_cancel_mid_run_releases_the_child_at_its_checkpoint(store: FakeStore) -> None:
    def cancelled_at_3(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        for i in ctx.resume(range(10)):
            if i == 3:
                child.run_state = RunState.CANCELLED
                until(ctx.should_stop)

    with pytest.raises(Ignore):
        run(store, template(cancelled_at_3))
    c = store.children
    assert (c.state, c.attempt, c.checkpoint_state) == (ChildState.PENDING, 0, {"done": 4})
    assert c.writes[-1] == "release"  # and no message: the run is not active (no broker here)


def test_cancel_during_finish_the_finished_work_counts(store: FakeStore) -> None:
    def cancelled_as_it_returns(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        works(ctx, child)
        child.run_state = RunState.CANCELLED

    run(store, template(cancelled_as_it_returns))
    assert store.children.state is ChildState.SUCCEEDED


def test_an_exception_fails_the_attempt_and_retries_from_the_checkpoint(store: FakeStore) -> None:
    def raises_at_5(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        for i in ctx.resume(range(10)):
            if i == 5:
                raise KeyError("x")

    task = FakeTask()
    with pytest.raises(Retried):
        run(store, template(raises_at_5), task)
    c = store.children
    assert (c.state, c.attempt, c.checkpoint_state) == (ChildState.PENDING, 1, {"done": 5})
    assert c.last_error == "KeyError: 'x'" and len(task.retries) == 1


def test_the_last_failed_attempt_fails_the_child(store: FakeStore) -> None:
    def always_raises(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        raise ValueError("bad")

    store.children.attempt = 1  # this is attempt 2 of 2
    with pytest.raises(ChildFailed, match=r"gave up after 2 attempt\(s\): ValueError: bad"):
        run(store, template(always_raises))
    assert store.children.state is ChildState.FAILED
    assert store.runs.finalized == [1]


def test_over_its_execution_cap_a_stepping_child_fails_its_attempt(store: FakeStore) -> None:
    def spins(ctx: dtask.ChildContext, child: FakeChildren) -> None:
        while True:
            ctx.checkpoint(ctx.checkpoint_state)
            time.sleep(0.01)

    with pytest.raises(Retried):
        run(store, template(spins, execution_cap=0.1))
    c = store.children
    assert c.state is ChildState.PENDING and c.attempt == 1
    assert c.last_error == "run 1 child 0 attempt 1 exceeded its execution cap of 0.1 s"
