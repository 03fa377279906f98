"""A world for the contract suite: a store (the in-memory one, or the real one on the test
session's PostgreSQL) and what a test needs around it: a run split into children, and time
passing for one child's lease."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import text

from dtask.db import ChildView, Claim, Finished, Refusal, RunRecord, Store
from dtask.db.runs import Chained, Reducer
from dtask.domain.runs import ChildState, NewRun, RunState
from dtask.worker.child_store import ChildWrites
from tests.support.memory import MemoryStore, Send


class Children(ChildWrites, Protocol):
    """What the child lifecycle and the batch path ask of ``store.children``."""

    def claim(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal: ...
    def claim_many(
        self, run_id: int, indexes: list[int], owner: str, lease_ttl: float
    ) -> dict[int, Claim]: ...
    def start(self, claim: Claim, lease_ttl: float) -> Claim | None: ...
    def write_batch(
        self, done: list[Finished], claim: Claim | None, lease_ttl: float
    ) -> tuple[set[int], Claim | None]: ...
    def unclaim(self, claim: Claim) -> None: ...
    def revoke(self, run_id: int, index: int, error: str) -> bool: ...
    def view(self, run_id: int, index: int) -> ChildView | None: ...


class Runs(Protocol):
    def get(self, run_id: int) -> RunRecord: ...
    def dispatch(
        self, run_id: int, send: Send, wait: bool = True, deferred: bool = False
    ) -> RunState: ...
    def cancel(self, run_id: int) -> RunState: ...
    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool: ...
    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = ...,
    ) -> RunState: ...


# (children, max_attempts, execution cap) -> a run created and split, not dispatched
MakeRun = Callable[[int, int, float | None], int]


@dataclass
class World:
    name: str
    children: Children
    runs: Runs
    make: MakeRun
    expire: Callable[[int, int], None]  # the child's lease has run out (time passed)

    def run(
        self,
        children: int = 3,
        max_attempts: int = 2,
        dispatched: bool = True,
        execution_cap: float | None = None,
    ) -> int:
        """A run of ``children`` children ({"i": index}), running once ``dispatched``."""
        run_id = self.make(children, max_attempts, execution_cap)
        if dispatched:
            assert self.runs.dispatch(run_id, lambda run, sent: None) is RunState.RUNNING
        return run_id

    def claim(self, run_id: int, index: int = 0, owner: str = "me", ttl: float = 30) -> Claim:
        taken = self.children.claim(run_id, index, owner, ttl)
        assert isinstance(taken, Claim), taken
        return taken

    def refusal(self, run_id: int, index: int = 0, owner: str = "late") -> Refusal:
        refused = self.children.claim(run_id, index, owner, 30)
        assert isinstance(refused, Refusal), refused
        return refused

    def take_over(self, run_id: int, index: int = 0, owner: str = "other") -> Claim:
        """Another worker takes the child once its holder's lease has run out."""
        self.expire(run_id, index)
        return self.claim(run_id, index, owner)

    def view(self, run_id: int, index: int = 0) -> ChildView:
        seen = self.children.view(run_id, index)
        assert seen is not None
        return seen

    def seen(self, run_id: int, index: int = 0) -> tuple[ChildState, int, str | None, Any]:
        """The child as an operator reads it: (state, attempt, owner, checkpoint)."""
        v = self.view(run_id, index)
        return v.state, v.attempt, v.owner, v.checkpoint


def memory() -> World:
    store = MemoryStore()

    def make(children: int, max_attempts: int, cap: float | None) -> int:
        specs = [{"i": i} for i in range(children)]
        return store.runs.add("t", specs, max_attempts, cap, {"n": children})

    def expire(run_id: int, index: int) -> None:
        store.row(run_id, index).lease_expires_at = store.tables.clock() - 1

    return World("memory", store.children, store.runs, make, expire)


def postgresql(store: Store) -> World:
    def make(children: int, max_attempts: int, cap: float | None) -> int:
        key = f"contract:{uuid.uuid4()}"
        new = NewRun("t", key, {"n": children}, max_attempts, None, execution_cap=cap)
        run_id, created = store.runs.create(new)
        assert created
        specs = [{"i": i} for i in range(children)]
        assert store.runs.split(run_id, lambda run: specs) is RunState.SPLITTING
        return run_id

    def expire(run_id: int, index: int) -> None:
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE dtask_children SET lease_expires_at = now() - interval '1 second'"
                    " WHERE run_id = :r AND index = :i"
                ),
                {"r": run_id, "i": index},
            )

    return World("postgresql", store.children, store.runs, make, expire)
