"""The SQL of schedules. A slot fires once because its run's trigger key is unique (per client: a
schedule's runs are charged to its client, ``default``, whatever other clients' keys); a beat pass
locks each schedule row it decides (``FOR UPDATE SKIP LOCKED``), so two beats never decide the
same schedule at once and a beat killed mid-pass decides nothing (its transaction rolls back).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import Connection, Row, text
from sqlalchemy.exc import DBAPIError

from dtask.db import counters
from dtask.db.database import Database
from dtask.db.run_inserts import insert_run
from dtask.domain.cron import Cron
from dtask.domain.deadlines import OnLate
from dtask.domain.runs import NewRun, RunState
from dtask.domain.schedules import Misfire, Overlap, Schedule, Timing, iso
from dtask.exceptions import DtaskError, InvalidSchedule, ScheduleExists, ScheduleNotFound

log = logging.getLogger("dtask.beat")

_COLUMNS = (
    "s.name, s.template, s.variables, s.cron, s.every_seconds, s.timezone, s.enabled, s.misfire,"
    " s.overlap, s.misfire_grace, s.catch_up_window, s.start_at, s.end_at, s.decided_until,"
    " s.buffered_slot, s.last_run_id, s.last_error, s.delay_tolerance, s.on_late,"
    " s.after_schedule"
)


@dataclass(frozen=True)
class Firing:
    """What a beat pass decided for one schedule: runs to create and its new bookkeeping."""

    runs: list[NewRun]
    decided_until: datetime
    buffered: datetime | None
    error: str | None = None
    changed: bool = True  # False: nothing to write (most passes of most schedules)
    missed: str | None = None  # what this pass found missed (a misfire), for the alert
    missed_slots: int = 0
    due_at: datetime | None = None  # when to decide it again; None: at the next pass


@dataclass
class Fired:
    """Runs a beat pass created (their masters are to be woken after commit)."""

    created: list[tuple[int, NewRun]] = field(default_factory=list)
    held: list[tuple[int, NewRun]] = field(default_factory=list)  # waiting or failed at once
    existing: list[tuple[int, NewRun]] = field(default_factory=list)
    decided: int = 0  # schedules decided (the due ones)
    next_due: datetime | None = None  # the earliest any enabled schedule is due after it
    now: datetime | None = None  # PostgreSQL's clock at the pass's last chunk


Decide = Callable[[Schedule, datetime, bool], Firing]
CHUNK = 500  # schedules decided per transaction (each held at most the beat's limit)
# a schedule held by something else (a buffered slot, an upstream schedule, an error) is looked
# at again this much later: a beat's passes then come about a second apart, as before
LOOK_AGAIN = "interval '1 second'"


class ScheduleStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def save(self, schedule: Schedule, replace: bool) -> tuple[Schedule, bool]:
        """Create the schedule (its first slot comes after now). An existing one with the
        same definition is returned as is; with ``replace`` a different one is updated in
        place (keeping what was decided); otherwise ScheduleExists."""
        values = _definition(schedule)
        with self.db.tx() as conn:
            if schedule.after_schedule is not None:
                _check_upstream(conn, schedule.name, schedule.after_schedule)
            created = conn.execute(
                text(
                    "INSERT INTO dtask_schedules (name, template, variables, cron, every_seconds,"
                    " timezone, misfire, overlap, misfire_grace, catch_up_window, start_at,"
                    " end_at, delay_tolerance, on_late, after_schedule, decided_until)"
                    " VALUES (:name, :template,"
                    " CAST(:variables AS jsonb), :cron, :every, :tz, :misfire, :overlap, :grace,"
                    " :catch_up_window, :start, :end, :delay_tolerance, :on_late,"
                    " :after_schedule, now())"
                    " ON CONFLICT (name) DO NOTHING RETURNING name"
                ),
                values,
            ).first()
            if created is not None:
                return self._get(conn, schedule.name), True
            existing = self._get(conn, schedule.name, lock=True)
            if existing.same_definition(schedule):
                return existing, False
            if not replace:
                raise ScheduleExists(
                    f"schedule {schedule.name!r} exists with another definition"
                    " (`dtask schedule rm` it first, or add with --replace)"
                )
            conn.execute(
                text(
                    "UPDATE dtask_schedules SET template = :template,"
                    " variables = CAST(:variables AS jsonb), cron = CAST(:cron AS varchar),"
                    " every_seconds = CAST(:every AS integer), timezone = CAST(:tz AS varchar),"
                    " misfire = :misfire, overlap = :overlap, misfire_grace = :grace,"
                    " catch_up_window = :catch_up_window,"
                    " start_at = :start, end_at = :end, last_error = NULL,"
                    " delay_tolerance = :delay_tolerance, on_late = :on_late,"
                    " after_schedule = CAST(:after_schedule AS varchar),"
                    " buffered_slot = CASE WHEN cron IS DISTINCT FROM CAST(:cron AS varchar)"
                    "   OR every_seconds IS DISTINCT FROM CAST(:every AS integer)"
                    "   OR timezone <> CAST(:tz AS varchar) THEN NULL ELSE buffered_slot END,"
                    " next_due_at = now(), updated_at = now() WHERE name = :name"
                ),
                values,
            )
            return self._get(conn, schedule.name), False

    def get(self, name: str) -> Schedule:
        with self.db.tx() as conn:
            return self._get(conn, name)

    def all(self) -> list[Schedule]:
        with self.db.tx() as conn:
            rows = conn.execute(text(f"SELECT {_COLUMNS} FROM dtask_schedules s ORDER BY s.name"))
            return [_schedule(r) for r in rows]

    def set_enabled(self, name: str, enabled: bool) -> Schedule:
        """Pause, or resume from now: slots that came while paused are not runs to catch up."""
        with self.db.tx() as conn:
            changed = conn.execute(
                text(
                    "UPDATE dtask_schedules SET enabled = :enabled, updated_at = now(),"
                    " next_due_at = now(),"
                    " decided_until = CASE WHEN :enabled AND NOT enabled THEN now()"
                    "   ELSE decided_until END,"
                    " buffered_slot = CASE WHEN :enabled AND NOT enabled THEN NULL"
                    "   ELSE buffered_slot END"
                    " WHERE name = :name RETURNING name"
                ),
                {"name": name, "enabled": enabled},
            ).first()
            if changed is None:
                raise _not_found(name)
            return self._get(conn, name)

    def remove(self, name: str) -> None:
        """Delete the schedule; the runs it triggered stay."""
        with self.db.tx() as conn:
            gone = conn.execute(
                text("DELETE FROM dtask_schedules WHERE name = :name RETURNING name"),
                {"name": name},
            ).first()
        if gone is None:
            raise _not_found(name)

    def backfill(self, name: str, runs: list[NewRun]) -> Fired:
        """The runs of some of the schedule's slots, in one transaction, each once per slot
        (a slot that has its run keeps it), each after its upstream schedule's run of the
        latest slot at or before it, as the beat fires them; the schedule's own bookkeeping
        (what it decided, its next slot) is left alone."""
        fired = Fired()
        with self.db.tx() as conn:
            schedule = self._get(conn, name)
            for run in runs:
                _insert_slot(conn, run, schedule.after_schedule, fired)
        return fired

    def beat_pass(self, decide: Decide, hold_for: float, chunk: int = CHUNK) -> Fired:
        """Decide every enabled schedule that is due and no other beat is deciding, ``chunk``
        at a time, each chunk in a transaction of its own held at most ``hold_for`` seconds.

        ``decide(schedule, now, previous_running)`` gets PostgreSQL's clock, so beats on
        machines with skewed clocks agree on what is due. The runs it asks for are inserted
        with their slot's trigger key (a key that exists is not inserted again). A schedule
        that is not due (its ``next_due_at`` is ahead) is not read at all: a pass costs what
        is due, not how many schedules there are.
        """
        fired = Fired()
        paused = DtaskError(
            "the beat's pass was held past its limit (this beat was paused); nothing of"
            " it was recorded, the next pass decides again"
        )
        after = 0
        while True:
            with self.db.held(hold_for, paused) as conn:
                now = fired.now = conn.execute(text("SELECT now()")).scalar_one()
                rows = conn.execute(
                    text(
                        f"SELECT {_COLUMNS}, s.id, coalesce(r.state IN ('waiting', 'pending',"
                        " 'splitting', 'running'), false) AS previous_running"
                        " FROM dtask_schedules s LEFT JOIN dtask_runs r ON r.id = s.last_run_id"
                        " WHERE s.enabled AND s.next_due_at <= now() AND s.id > :after"
                        " ORDER BY s.id LIMIT :chunk FOR UPDATE OF s SKIP LOCKED"
                    ),
                    {"after": after, "chunk": chunk},
                ).all()
                for row in rows:
                    one = partial(self._decide, conn, row, now, decide)
                    _isolated(conn, row.name, one, fired)
                if len(rows) < chunk:
                    fired.next_due = conn.execute(
                        text("SELECT min(next_due_at) FROM dtask_schedules WHERE enabled")
                    ).scalar()
                    return fired
                after = rows[-1].id

    def _decide(
        self, conn: Connection, row: Row[Any], now: datetime, decide: Decide, fired: Fired
    ) -> None:
        try:
            schedule = _schedule(row)
        except DtaskError as exc:  # e.g. a time zone this host does not know
            error = f"cannot be read by this beat: {exc}"
            firing = Firing([], row.decided_until, row.buffered_slot, error)
        else:
            at = _decided_upstream(conn, schedule.after_schedule, now)
            firing = decide(schedule, at, bool(row.previous_running))
        self._record(conn, row.name, firing, fired, row.after_schedule)
        fired.decided += 1

    @staticmethod
    def _record(
        conn: Connection, name: str, firing: Firing, fired: Fired, after_schedule: str | None
    ) -> None:
        if not (firing.changed or firing.runs):
            conn.execute(
                text(
                    "UPDATE dtask_schedules SET next_due_at = coalesce(CAST(:due AS timestamptz),"
                    f" now() + {LOOK_AGAIN}) WHERE name = :name"
                ),
                {"name": name, "due": firing.due_at},
            )
            return
        last_run = None
        for planned in firing.runs:
            last_run = _insert_slot(conn, planned, after_schedule, fired)
        counters.add(conn, counters.SLOTS_FIRED, len(firing.runs), name)
        counters.add(conn, counters.SLOTS_MISSED, firing.missed_slots, name)
        conn.execute(
            text(
                "UPDATE dtask_schedules SET decided_until = greatest(decided_until, :until),"
                " buffered_slot = CAST(:buffered AS timestamptz),"
                " last_run_id = coalesce(CAST(:last_run AS bigint), last_run_id),"
                " last_error = CASE WHEN CAST(:error AS text) IS NOT NULL THEN :error"
                "   WHEN CAST(:last_run AS bigint) IS NOT NULL THEN NULL ELSE last_error END,"
                " misfired_at = CASE WHEN CAST(:missed AS text) IS NOT NULL THEN now()"
                "   ELSE misfired_at END,"
                " misfire_note = coalesce(CAST(:missed AS text), misfire_note),"
                f" next_due_at = coalesce(CAST(:due AS timestamptz), now() + {LOOK_AGAIN}),"
                " updated_at = now() WHERE name = :name"
            ),
            {
                "name": name,
                "until": firing.decided_until,
                "buffered": firing.buffered,
                "last_run": last_run,
                "error": firing.error,
                "missed": firing.missed,
                "due": firing.due_at,
            },
        )

    @staticmethod
    def _get(conn: Connection, name: str, lock: bool = False) -> Schedule:
        row = conn.execute(
            text(
                f"SELECT {_COLUMNS} FROM dtask_schedules s WHERE s.name = :name"
                + (" FOR UPDATE" if lock else "")
            ),
            {"name": name},
        ).first()
        if row is None:
            raise _not_found(name)
        return _schedule(row)


def _isolated(conn: Connection, name: str, decide: Callable[[Fired], None], fired: Fired) -> None:
    """Decide one schedule under a savepoint: whatever it raises (a run PostgreSQL refuses, a
    slot past what datetime holds) rolls back only its own writes, is recorded as its
    ``last_error`` (its alert) and looked at again after BROKEN_AGAIN, and the pass goes on
    with the other schedules, which it would otherwise have rolled back with it."""
    one = Fired()
    try:
        with conn.begin_nested():
            decide(one)
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise
        _broken(conn, name, _one_line(exc.orig if exc.orig is not None else exc))
        return
    except Exception as exc:  # one schedule's fault, whatever it is
        _broken(conn, name, _one_line(exc))
        return
    fired.created += one.created
    fired.held += one.held
    fired.existing += one.existing
    fired.decided += one.decided


BROKEN_AGAIN = "interval '60 seconds'"  # a schedule that failed its decision is tried again


def _broken(conn: Connection, name: str, error: str) -> None:
    """Record why ``name`` was not decided; log it once, not on each try."""
    error = f"not decided: {error}"[:1000]
    before = conn.execute(
        text(
            "UPDATE dtask_schedules s SET last_error = :error,"
            f" next_due_at = now() + {BROKEN_AGAIN}, updated_at = CASE"
            " WHEN s.last_error IS DISTINCT FROM :error THEN now() ELSE s.updated_at END"
            " FROM (SELECT last_error FROM dtask_schedules WHERE name = :name) b"
            " WHERE s.name = :name RETURNING b.last_error"
        ),
        {"name": name, "error": error},
    ).scalar()
    if before != error:
        log.warning("schedule %s: %s; tried again every 60 s", name, error)


def _one_line(exc: BaseException) -> str:
    text_ = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text_}"[:500]


def _check_upstream(conn: Connection, name: str, upstream: str) -> None:
    """The schedule to run after exists and does not (through others) run after this one."""
    chain = [
        r.name
        for r in conn.execute(
            text(
                "WITH RECURSIVE chain(name, depth) AS (SELECT CAST(:up AS varchar), 0"
                " UNION SELECT s.after_schedule, c.depth + 1 FROM dtask_schedules s"
                " JOIN chain c ON s.name = c.name"
                " WHERE s.after_schedule IS NOT NULL AND c.depth < 100)"
                " SELECT c.name, s.name IS NOT NULL AS found FROM chain c"
                " LEFT JOIN dtask_schedules s ON s.name = c.name ORDER BY c.depth"
            ),
            {"up": upstream},
        )
        if r.found
    ]
    if not chain:
        raise InvalidSchedule(
            f"--after-schedule {upstream!r}: no such schedule (see `dtask schedule list`)"
        )
    if name in chain:
        raise InvalidSchedule(
            f"schedule {name!r} cannot run after {upstream!r}: {upstream!r} already runs after"
            f" {name!r} (through {' -> '.join(chain[: chain.index(name) + 1])})"
        )


def _decided_upstream(conn: Connection, upstream: str | None, now: datetime) -> datetime:
    """How far a schedule that runs after ``upstream`` may be decided: up to just before the
    upstream's next undecided slot (so the upstream's slot run at or before it exists, or was
    skipped), or ``now`` if that slot is later, or the upstream is gone, paused or unreadable."""
    if upstream is None:
        return now
    row = conn.execute(
        text(f"SELECT {_COLUMNS} FROM dtask_schedules s WHERE s.name = :name"), {"name": upstream}
    ).first()
    if row is None or not row.enabled:
        return now
    try:
        waiting = _schedule(row).timing.next_slot(row.decided_until)
    except DtaskError:
        return now
    if waiting is None or waiting > now:
        return now
    decided: datetime = row.decided_until
    return max(decided, waiting - timedelta(microseconds=1))


def _after_upstream_slot(conn: Connection, run: NewRun, upstream: str | None) -> NewRun:
    """The slot's run waits for ``upstream``'s run of the latest slot at or before its own;
    it fails at once if that schedule has no run at or before it."""
    if upstream is None or run.slot is None:
        return run
    found = conn.execute(
        text(
            "SELECT id FROM dtask_runs WHERE schedule = :up AND slot <= :slot"
            " ORDER BY slot DESC, id DESC LIMIT 1"
        ),
        {"up": upstream, "slot": run.slot},
    ).first()
    if found is None:
        unmet = f"schedule {upstream!r} has no run at or before slot {iso(run.slot)} to wait for"
        return replace(run, unmet=unmet)
    return replace(run, after=(int(found.id),))


def _insert_slot(
    conn: Connection, planned: NewRun, after_schedule: str | None, fired: Fired
) -> int:
    """A slot's run, once per slot (its key): created (its master to be sent), held (waiting
    for its upstream slot's run, or failed by it), or found existing; its id."""
    run = _after_upstream_slot(conn, planned, after_schedule)
    created = insert_run(conn, run)
    if created is not None:
        run_id = created.id
        held = created.state is not RunState.PENDING  # its upstream or key, or failed by it
        (fired.held if held else fired.created).append((run_id, run))
    else:
        run_id = conn.execute(  # the slot's run, charged to the schedule's client
            text("SELECT id FROM dtask_runs WHERE client = :client AND trigger_key = :key"),
            {"client": run.client, "key": run.key},
        ).scalar_one()
        fired.existing.append((run_id, run))
    return int(run_id)


def _not_found(name: str) -> ScheduleNotFound:
    return ScheduleNotFound(f"no schedule named {name!r} (see `dtask schedule list`)")


def _definition(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "template": schedule.template,
        "variables": json.dumps(schedule.variables),
        **schedule.timing.when(),
        "after_schedule": schedule.after_schedule,
    }


def _schedule(row: Row[Any]) -> Schedule:
    return Schedule(
        name=row.name,
        template=row.template,
        variables=row.variables,
        timing=Timing(
            trigger=Cron.parse(row.cron) if row.cron is not None else int(row.every_seconds),
            tz=row.timezone,
            misfire=Misfire(row.misfire),
            overlap=Overlap(row.overlap),
            grace=row.misfire_grace,
            catch_up_window=row.catch_up_window,
            start_at=row.start_at,
            end_at=row.end_at,
            delay_tolerance=row.delay_tolerance,
            on_late=None if row.on_late is None else OnLate(row.on_late),
        ),
        enabled=row.enabled,
        decided_until=row.decided_until,
        buffered=row.buffered_slot,
        last_run_id=row.last_run_id,
        last_error=row.last_error,
        after_schedule=row.after_schedule,
    )
