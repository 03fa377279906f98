"""The in-memory store's tables (tests/support/memory.py): a run's and a child's row, with
the columns the child lifecycle, the dispatcher and dependencies read and write, the CHECKs
PostgreSQL enforces on them, and the clients' rows."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError

from dtask.db import ChildView, RunRecord
from dtask.domain.clients import DEFAULT_CLIENT, DEFAULT_PRIORITY, Client, Tier
from dtask.domain.runs import ChildState, RunState


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def jsonb(value: Any) -> Any:
    """``value`` as a jsonb column gives it back: a copy, through JSON."""
    return None if value is None else json.loads(json.dumps(value))


@dataclass
class RunRow:
    id: int
    template: str
    key: str
    variables: dict[str, Any]
    max_attempts: int
    execution_cap: float | None = None
    state: RunState = RunState.SPLITTING
    group_id: str | None = None
    dispatches: int = 0
    child_total: int | None = None
    chord_size: int | None = None
    result: Any = None
    error: str | None = None
    child_seconds: float | None = None
    client: str = DEFAULT_CLIENT
    priority: int = DEFAULT_PRIORITY
    deadline: datetime | None = None
    queue: str | None = None
    tier: Tier = Tier.BASIC
    unsent: int = 0  # children left to the dispatcher
    sent_through: int = 0  # the dispatcher took its children below this index
    after: tuple[int, ...] = ()  # its upstreams (dtask_run_deps), in id order
    split_slots: int | None = None
    terminate: bool = False  # cancelled with --terminate
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None

    def record(self) -> RunRecord:
        return RunRecord(
            self.id, self.template, self.key, self.variables, self.state, self.max_attempts,
            self.queue, self.child_total, self.group_id, self.chord_size, self.dispatches,
            tier=self.tier,
        )  # fmt: skip


@dataclass
class ChildRow:
    id: int
    run_id: int
    index: int
    spec: dict[str, Any]
    max_attempts: int
    state: ChildState = ChildState.PENDING
    attempt: int = 0
    fence: int = 0
    owner: str | None = None
    lease_expires_at: float | None = None
    checkpoint: Any = None
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    output: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    sent_at: float | None = None
    give_away: bool = False
    cuts: int = 0

    def view(self) -> ChildView:
        """As ``ChildReads.view`` reads it: a running child is in its first attempt at least
        (one taken with its message counts that attempt only as it ends)."""
        attempt = max(self.attempt, 1) if self.state is ChildState.RUNNING else self.attempt
        return ChildView(self.index, self.state, attempt, self.owner, jsonb(self.checkpoint))

    def counted(self, change: int) -> int:
        """``attempt`` after ``change``, under dtask_children's CHECK on it (raised as
        PostgreSQL's is, before anything of the write is made)."""
        attempt = self.attempt + change
        if not 0 <= attempt <= self.max_attempts:
            raise IntegrityError(
                "UPDATE dtask_children",
                {"id": self.id, "attempt": attempt},
                ValueError('new row for relation "dtask_children" violates check constraint'),
            )
        return attempt


@dataclass
class MessageRow:
    """A message of several children the dispatcher sent (``dtask_messages``)."""

    run_id: int
    lo: int
    hi: int
    children: int  # sent; once owned, those it still covers
    sent_at: float
    claimed_at: float | None = None
    id: int = 0
    fence: int = 0  # its claim (db/message_claims.py)
    owner: str | None = None
    lease_expires_at: float | None = None


@dataclass
class Tables:
    """Both tables behind one lock: each store method is one statement, atomic as
    PostgreSQL's, also against a heartbeat thread."""

    clock: Callable[[], float] = time.monotonic
    runs: dict[int, RunRow] = field(default_factory=dict)
    children: dict[int, ChildRow] = field(default_factory=dict)
    messages: dict[tuple[int, int], MessageRow] = field(default_factory=dict)  # (run, lo)
    message_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    clients: dict[str, Client] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def child(self, run_id: int, index: int) -> ChildRow | None:
        for row in self.children.values():
            if row.run_id == run_id and row.index == index:
                return row
        return None

    def of_run(self, run_id: int) -> list[ChildRow]:
        return sorted((c for c in self.children.values() if c.run_id == run_id), key=_index)

    def failure_summary(self, run_id: int) -> str:
        failed = [c for c in self.of_run(run_id) if c.state is ChildState.FAILED]
        shown = "; ".join(f"child {c.index}: {c.error}" for c in failed[:3])
        return f"{len(failed)} child task(s) failed: {shown}"

    def active(self, run_id: int) -> bool:
        run = self.runs.get(run_id)
        return run is not None and run.state in (RunState.SPLITTING, RunState.RUNNING)

    def leased(self, row: ChildRow) -> bool:
        return row.lease_expires_at is not None and row.lease_expires_at > self.clock()

    def free(self, row: ChildRow) -> bool:
        """Pending, or running with an expired lease (NULL compares as PostgreSQL's does)."""
        expired = row.lease_expires_at is not None and row.lease_expires_at < self.clock()
        return row.state is ChildState.PENDING or (row.state is ChildState.RUNNING and expired)

    def takeable(self, row: ChildRow) -> bool:
        """The claim's WHERE: free, with an attempt left, in an active run, not a child an
        owned message covers."""
        return (
            row.attempt < row.max_attempts
            and self.free(row)
            and self.active(row.run_id)
            and self.holder(row) is None
        )

    def holder(self, row: ChildRow) -> MessageRow | None:
        """The owned message whose claim covers ``row`` (pending, unsent, in its range)."""
        if row.state is not ChildState.PENDING or row.sent_at is not None:
            return None
        for m in self.messages.values():
            if m.run_id == row.run_id and m.owner is not None and m.lo <= row.index <= m.hi:
                return m
        return None

    def message(self, message_id: int | None) -> MessageRow | None:
        for m in self.messages.values():
            if m.id == message_id:
                return m
        return None


def _index(row: ChildRow) -> int:
    return row.index
