"""States of runs and children, their allowed transitions, and status value objects. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from dtask.domain.clients import DEFAULT_CLIENT, DEFAULT_PRIORITY, Client, Tier
from dtask.domain.deadlines import OnLate
from dtask.domain.schedules import iso
from dtask.domain.tiers import tier_queue


class RunState(StrEnum):
    WAITING = "waiting"  # for the runs it was submitted after (its upstreams) to succeed
    PENDING = "pending"
    SPLITTING = "splitting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in _FINISHED_RUN


class ChildState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (ChildState.SUCCEEDED, ChildState.FAILED)


_FINISHED_RUN = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})

RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    # released when its last upstream succeeds; failed when one fails or is cancelled
    RunState.WAITING: frozenset({RunState.PENDING, RunState.FAILED, RunState.CANCELLED}),
    RunState.PENDING: frozenset({RunState.SPLITTING, RunState.FAILED, RunState.CANCELLED}),
    RunState.SPLITTING: frozenset({RunState.RUNNING, RunState.FAILED, RunState.CANCELLED}),
    RunState.RUNNING: frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}),
    RunState.SUCCEEDED: frozenset(),
    # rerun: back to pending (never split), splitting (dispatch the unfinished children) or
    # waiting (never split, and an upstream is running again)
    RunState.FAILED: frozenset({RunState.WAITING, RunState.PENDING, RunState.SPLITTING}),
    RunState.CANCELLED: frozenset({RunState.WAITING, RunState.PENDING, RunState.SPLITTING}),
}

CHILD_TRANSITIONS: dict[ChildState, frozenset[ChildState]] = {
    ChildState.PENDING: frozenset({ChildState.RUNNING, ChildState.FAILED}),
    # running -> running is a takeover (the fence moves); running -> pending is a retry.
    ChildState.RUNNING: frozenset(
        {ChildState.RUNNING, ChildState.PENDING, ChildState.SUCCEEDED, ChildState.FAILED}
    ),
    ChildState.SUCCEEDED: frozenset(),
    ChildState.FAILED: frozenset(),
}


def can_move(current: RunState, target: RunState) -> bool:
    return target in RUN_TRANSITIONS[current]


def can_move_child(current: ChildState, target: ChildState) -> bool:
    return target in CHILD_TRANSITIONS[current]


def sources(target: RunState) -> list[str]:
    """The states a run may move to ``target`` from (for conditional UPDATEs)."""
    return [s.value for s, targets in RUN_TRANSITIONS.items() if target in targets]


@dataclass(frozen=True)
class ChildCounts:
    total: int = 0
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0

    @classmethod
    def from_states(cls, by_state: dict[str, int]) -> ChildCounts:
        known = {s.value: by_state.get(s.value, 0) for s in ChildState}
        return cls(total=sum(by_state.values()), **known)

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed

    @property
    def all_finished(self) -> bool:
        return self.total > 0 and self.finished == self.total


def outcome(counts: ChildCounts) -> RunState | None:
    """The master's final state once every child has finished, else None."""
    if not counts.all_finished:
        return None
    return RunState.FAILED if counts.failed else RunState.SUCCEEDED


@dataclass(frozen=True)
class RunStatus:
    id: int
    template: str
    key: str
    state: RunState
    variables: dict[str, Any]
    children: ChildCounts
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    schedule: str | None = None  # the schedule whose slot triggered the run
    slot: datetime | None = None
    client: str = DEFAULT_CLIENT
    priority: int = DEFAULT_PRIORITY
    deadline: datetime | None = None  # to start by: submit time (or slot) + delay tolerance
    late: bool | None = None  # None: not decided yet (or no deadline)
    start_after: datetime | None = None  # apply_async's countdown or eta: not started before
    result: Any = None  # the template's reduce of its children's results (JSON)
    tier: Tier = Tier.BASIC
    notify: dict[str, Any] | None = None  # the completion notification's delivery, if asked
    after: tuple[int, ...] = ()  # the runs it was submitted after (its upstreams)
    waiting_for: tuple[int, ...] = ()  # those of them not finished yet
    slots: int | None = None  # the live slots a split by capacity saw (parts="slots")
    concurrency_key: str | None = None  # its rendered key, and how many unfinished runs of
    max_concurrent: int | None = None  # its client may share it

    @property
    def finished(self) -> bool:
        return self.state.finished

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "template": self.template,
            "key": self.key,
            "state": self.state.value,
            "variables": self.variables,
            "children": asdict(self.children),
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "error": self.error,
            "schedule": self.schedule,
            "slot": iso(self.slot) if self.slot else None,
            "client": self.client,
            "priority": self.priority,
            "deadline": self.deadline.isoformat() if self.deadline else None,
            "start_after": self.start_after.isoformat() if self.start_after else None,
            "result": self.result,
            "late": bool(self.late),
            "tier": self.tier.value,
            "notify": self.notify,
            "after": list(self.after),
            "waiting_for": list(self.waiting_for),
            "slots": self.slots,
            "concurrency_key": self.concurrency_key,
            "max_concurrent": self.max_concurrent,
        }


class RunHandle(Protocol):
    """A handle on one run, as ``Template.delay`` returns it (``dtask.Run`` is the one)."""

    id: int
    created: bool

    def status(self) -> RunStatus: ...

    @property
    def state(self) -> RunState: ...

    def ready(self) -> bool: ...
    def get(self, timeout: float | None = None) -> Any: ...
    async def aget(self, timeout: float | None = None, *, poll: float = 0.5) -> Any: ...

    def wait(
        self,
        timeout: float | None = None,
        *,
        poll: float = 0.5,
        on_progress: Callable[[RunStatus], None] | None = None,
    ) -> RunStatus: ...

    def cancel(self, terminate: bool = False) -> RunStatus: ...

    def rerun(self) -> RunStatus: ...


class ClaimRefusal(StrEnum):
    """Why a child message cannot start its child (the claim UPDATE matched no row)."""

    GONE = "gone"  # no such child (run deleted)
    DONE = "done"  # already succeeded: report success again, counted once by the chord
    FAILED = "failed"  # already failed for good: report the same failure again
    BUSY = "busy"  # another owner holds a live lease: this message is a duplicate
    INACTIVE = "inactive"  # the run is not running (cancelled): leave the child pending
    EXHAUSTED = "exhausted"  # no attempts left: fail it now


def refuse_claim(
    state: ChildState | None, attempt: int, max_attempts: int, leased: bool, run_active: bool = True
) -> ClaimRefusal:
    if state is None:
        return ClaimRefusal.GONE
    if not run_active and not state.finished:
        return ClaimRefusal.INACTIVE
    if state is ChildState.SUCCEEDED:
        return ClaimRefusal.DONE
    if state is ChildState.FAILED:
        return ClaimRefusal.FAILED
    if state is ChildState.RUNNING and leased:
        return ClaimRefusal.BUSY
    if attempt >= max_attempts:
        return ClaimRefusal.EXHAUSTED
    # pending/expired with attempts left: the claim raced with another claimer who won.
    return ClaimRefusal.BUSY


@dataclass(frozen=True)
class NewRun:
    """A run to create, as one value from the call that asks for it (``submit``, the HTTP
    API, beat's slot) to the INSERT: adding an option touches this value, its check and the
    SQL. ``tier`` and ``priority`` are as asked (None: the client's, the default) until
    ``charged_to`` its client decides them."""

    template: str
    key: str
    variables: dict[str, Any]
    max_attempts: int
    queue: str | None
    schedule: str | None = None
    slot: datetime | None = None
    execution_cap: float | None = None  # overrides the template's
    client: str = DEFAULT_CLIENT
    priority: int | None = None
    expected_children: int | None = None
    delay_tolerance: float | None = None  # the deadline is the slot (or now) plus this
    on_late: OnLate = OnLate.RUN
    tier: Tier | None = None
    notify_url: str | None = None  # POSTed the run's JSON when it finishes
    start_at: datetime | None = None  # not split before this (eta)...
    start_in: float | None = None  # ...or this many seconds from now (countdown)
    after: tuple[int, ...] = ()  # upstream runs: it waits for them to succeed
    unmet: str | None = None  # why it fails at once (a schedule's upstream slot never ran)
    awaits_pickup: bool = False  # its master is sent by a pickup (dtask.pickup), not its own
    concurrency_key: str | None = None  # rendered: at most max_concurrent unfinished runs of
    max_concurrent: int | None = None  # its client share it (dtask.domain.concurrency)
    trace_context: dict[str, str] | None = None  # its submit's span, as W3C headers (traces.md)

    def charged_to(self, client: Client) -> NewRun:
        """This run as ``client`` gets it: its tier (as asked, else the client's; capped at
        the client's), that tier's queue, its priority (as asked, default 5; capped)."""
        tier = client.tier_for(self.tier)
        return replace(
            self,
            client=client.name,
            tier=tier,
            queue=tier_queue(self.queue, tier),
            priority=client.priority_for(self.priority),
        )
