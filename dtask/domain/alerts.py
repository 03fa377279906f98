"""Alerts: conditions an operator should act on, open while they hold.

The monitor reads *facts* from PostgreSQL on every pass and turns them into the alerts that
hold now; comparing them with the open ones gives what opened and what closed. Pure: the
thresholds come in as :class:`Limits`.

Who sees an alert (``GET /api/v1/alerts``, the dashboard) follows from what it names
(:data:`SCOPES`): an admin token every alert; a client's token the alerts about its own runs,
and the cluster's (a worker lost or idle: they name a worker, as ``/workers`` does for every
token, and no client's run), never one about another client's run, nor a schedule's (schedules
belong to no client: they are admin tokens' alone in the API).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class AlertKind(StrEnum):
    WORKER_LOST = "worker_lost"  # stopped reporting without leaving
    WORKER_IDLE = "worker_idle"  # no child for DTASK_IDLE_ALERT: it could be removed
    RUN_STALLED = "run_stalled"  # unfinished, nothing changed for DTASK_STALL_ALERT
    RUN_LATE = "run_late"  # past its delay tolerance and not started
    SCHEDULE_MISFIRED = "schedule_misfired"  # slots not run, or missed recently
    MESSAGES_LOST = "messages_lost"  # a queue's broker lost messages PostgreSQL had sent


class Scope(StrEnum):
    """Which tokens see an alert of a kind."""

    CLUSTER = "cluster"  # names no client's object: every token
    RUN = "run"  # about one run (its id the subject): the tokens that see the run's client
    ADMIN = "admin"  # about something of no client (a schedule): admin tokens only


SCOPES: dict[AlertKind, Scope] = {
    AlertKind.WORKER_LOST: Scope.CLUSTER,
    AlertKind.WORKER_IDLE: Scope.CLUSTER,
    AlertKind.RUN_STALLED: Scope.RUN,
    AlertKind.RUN_LATE: Scope.RUN,
    AlertKind.SCHEDULE_MISFIRED: Scope.ADMIN,
    AlertKind.MESSAGES_LOST: Scope.CLUSTER,
}


def kinds_of(scope: Scope) -> list[str]:
    """The kinds (their values, as stored) a client's token sees under ``scope``."""
    return sorted(kind.value for kind, in_scope in SCOPES.items() if in_scope is scope)


@dataclass(frozen=True, order=True)
class Alert:
    kind: AlertKind
    subject: str  # what it is about: a worker's name, a run id, a schedule's name
    message: str

    @property
    def key(self) -> tuple[str, str]:
        return self.kind.value, self.subject


@dataclass(frozen=True)
class Limits:
    lost_after: float  # seconds without a report
    idle_after: float
    stalled_after: float
    misfire_shown_for: float  # a missed slot stays an alert this long
    lost_shown_for: float = 600.0  # a broker's loss stays an alert this long after the last one


@dataclass(frozen=True)
class WorkerFact:
    name: str
    seen_ago: float
    busy: int
    idle_for: float | None  # None while busy


@dataclass(frozen=True)
class RunFact:
    id: int
    template: str
    quiet_for: float  # seconds since anything about it changed
    late_by: float | None  # past its deadline and not started; None otherwise


@dataclass(frozen=True)
class ScheduleFact:
    name: str
    error: str | None  # its slots are not being run
    misfire: str | None  # what was missed
    misfired_ago: float | None


@dataclass(frozen=True)
class LossFact:
    queue: str
    missing: int  # messages the broker was short of, the last time the reaper found a loss
    resent: int
    found_ago: float


@dataclass(frozen=True)
class Facts:
    workers: tuple[WorkerFact, ...] = ()
    runs: tuple[RunFact, ...] = ()
    schedules: tuple[ScheduleFact, ...] = ()
    losses: tuple[LossFact, ...] = ()


def duration(seconds: float) -> str:
    """A short human duration: 45 s, 16 min, 3.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _workers(facts: Iterable[WorkerFact], limits: Limits) -> Iterable[Alert]:
    for w in facts:
        if w.seen_ago > limits.lost_after:
            yield Alert(
                AlertKind.WORKER_LOST,
                w.name,
                f"worker {w.name} stopped reporting {duration(w.seen_ago)} ago"
                f" ({w.busy} children were running on it; they resume elsewhere)",
            )
        elif w.idle_for is not None and w.idle_for > limits.idle_after:
            yield Alert(
                AlertKind.WORKER_IDLE,
                w.name,
                f"worker {w.name} has run nothing for {duration(w.idle_for)}:"
                " it could be removed (`dtask drain`)",
            )


def _runs(facts: Iterable[RunFact], limits: Limits) -> Iterable[Alert]:
    for r in facts:
        if r.late_by is not None and r.late_by > 0:
            yield Alert(
                AlertKind.RUN_LATE,
                str(r.id),
                f"run {r.id} ({r.template}) has not started,"
                f" {duration(r.late_by)} past its delay tolerance",
            )
        if r.quiet_for > limits.stalled_after:
            yield Alert(
                AlertKind.RUN_STALLED,
                str(r.id),
                f"run {r.id} ({r.template}) has made no progress for {duration(r.quiet_for)}",
            )


def _schedules(facts: Iterable[ScheduleFact], limits: Limits) -> Iterable[Alert]:
    for s in facts:
        if s.error:
            yield Alert(AlertKind.SCHEDULE_MISFIRED, s.name, f"schedule {s.name}: {s.error}")
        elif (
            s.misfire and s.misfired_ago is not None and s.misfired_ago <= limits.misfire_shown_for
        ):
            yield Alert(AlertKind.SCHEDULE_MISFIRED, s.name, f"schedule {s.name}: {s.misfire}")


def _losses(facts: Iterable[LossFact], limits: Limits) -> Iterable[Alert]:
    for f in facts:
        if f.found_ago <= limits.lost_shown_for:
            yield Alert(
                AlertKind.MESSAGES_LOST,
                f.queue,
                f"queue {f.queue}: {f.missing} children sent were neither in the broker nor taken"
                f" by a worker a stall timeout later (a broker restarted without its data,"
                f" flushed or failed over; a queue deleted; a worker that died holding them);"
                f" the reaper re-sent {f.resent} from PostgreSQL",
            )


def evaluate(facts: Facts, limits: Limits) -> list[Alert]:
    """The alerts that hold now, at most one per (kind, subject), in a stable order."""
    found = {
        a.key: a
        for a in (
            *_workers(facts.workers, limits),
            *_runs(facts.runs, limits),
            *_schedules(facts.schedules, limits),
            *_losses(facts.losses, limits),
        )
    }
    return sorted(found.values())
