"""The child side's view of PostgreSQL and the broker: the part of the store a child's
lifecycle writes through (typed, so a fake can stand in), writes retried through a
PostgreSQL restart, and children handed back to the broker."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dtask.db import Claim, Redispatch
from dtask.db.steals import Gift
from dtask.domain.runs import ChildState, RunState
from dtask.exceptions import DatabaseUnavailable
from dtask.worker.finalize import Finalizes
from dtask.worker.messages import publish

T = TypeVar("T")


@dataclass(slots=True)
class Child:
    """One child of a received message; ``taken``: its claim, if it was claimed ahead."""

    run_id: int
    index: int
    template: str
    spec: dict[str, Any]
    taken: Claim | None = None

    def __str__(self) -> str:
        return f"run {self.run_id} child {self.index}"


class ChildWrites(Protocol):
    """What a claimed child's lifecycle writes: ``dtask.db.children.ChildStore`` (each write
    fenced), or a fake of it in unit tests."""

    def start(self, claim: Claim, lease_ttl: float) -> Claim | None: ...
    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None: ...
    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float, ran: float = 0.0) -> bool: ...
    def give_away(
        self, claim: Claim, run_id: int, keys: tuple[str, str], end: int, at: int, deferred: bool
    ) -> Gift | None: ...
    def finish(
        self,
        claim: Claim,
        final_checkpoint: Any | None,
        result: str | None = None,
        output: str | None = None,
    ) -> None: ...
    def release(self, claim: Claim, checkpoint: Any | None) -> None: ...
    def fail_attempt(
        self,
        claim: Claim,
        error: str,
        traceback: str | None = None,
        output: str | None = None,
        final: bool = False,
        skipped: int = 0,
    ) -> ChildState: ...
    def write_log(
        self, run_id: int, index: int, attempt: int, worker: str, kept: tuple[str | None, int]
    ) -> None: ...
    def error(self, run_id: int, index: int) -> str | None: ...
    def any_unfinished(self, run_id: int) -> bool: ...


class LifecycleStore(Protocol):
    """The part of ``Store`` the child lifecycle uses."""

    @property
    def children(self) -> ChildWrites: ...
    @property
    def runs(self) -> Finalizes: ...


def owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def patiently(
    call: Callable[[], T], patience: float, give_up: Callable[[], bool] = lambda: False
) -> T:
    """Retry a write while PostgreSQL is unreachable (a restart), for up to ``patience`` s,
    or until ``give_up()``."""
    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return call()
        except DatabaseUnavailable:
            if time.monotonic() + delay > deadline or give_up():
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def hand_over(
    store: LifecycleStore,
    run_id: int,
    template: str,
    items: list[tuple[int, dict[str, Any]]],
    countdown: float | None = None,
) -> bool:
    """Re-send children of one run this worker let go of, ahead of first-time children, in one
    publish (after ``countdown`` seconds); False when the run is no longer active (cancelled):
    nothing goes on with them."""
    run = store.runs.get(run_id)
    if run.state in (RunState.SPLITTING, RunState.RUNNING) and run.group_id is not None:
        resent = [Redispatch(run_id, i, s, template, run.group_id, run.queue) for i, s in items]
        publish(resent, countdown=countdown)
        return True
    return False
