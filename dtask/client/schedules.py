"""Managing schedules: create or replace, list, pause, resume, remove, backfill.

Variables are checked against the template when the schedule is saved, not when it fires.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Unpack

from dtask import services, tracing
from dtask.db.schedules import ScheduleStore
from dtask.domain.backfill import backfill_slots, slot_runs
from dtask.domain.limits import check_whole
from dtask.domain.runs import NewRun
from dtask.domain.schedules import SCHEDULE_NAME, Schedule, When, iso, make_timing
from dtask.domain.templates import registry
from dtask.exceptions import DtaskError, InvalidSchedule, ScheduleNotFound

log = logging.getLogger("dtask.client")


def _store() -> ScheduleStore:
    return services.store().schedules


def add_schedule(
    name: str,
    template: str,
    variables: dict[str, Any],
    *,
    replace: bool = False,
    after_schedule: str | None = None,
    **when: Unpack[When],
) -> Schedule:
    """Save a schedule whose first slot comes after now: exactly one of ``cron`` (5 fields, or
    6 with seconds first) or ``every`` (seconds); ``tz`` (IANA, default UTC), ``misfire``
    (skip, run_once, catch_up), ``overlap`` (allow, skip, buffer_one), ``grace`` (default 10 s),
    ``catch_up_window`` (default a day), ``start``/``end`` (aware datetimes). Saving the same
    definition again is a no-op; a different one raises ScheduleExists unless ``replace``.
    With ``after_schedule``, each slot's run waits for that schedule's run of the latest slot
    at or before its own (see docs/dependencies.md)."""
    tpl = registry.get(template)
    checked = tpl.validate(variables)
    tpl.precheck(checked, services.current().settings.max_children)
    timing = make_timing(now=datetime.now(UTC), **when)
    schedule = Schedule(name, tpl.name, checked, timing, after_schedule=after_schedule)
    saved, _ = _store().save(schedule, replace=replace)
    return saved


def _named(name: str) -> str:
    """A name no schedule can have is not looked up: ScheduleNotFound at once."""
    if not isinstance(name, str) or not SCHEDULE_NAME.fullmatch(name):
        raise ScheduleNotFound(f"no schedule named {str(name)[:100]!r} (see `dtask schedule list`)")
    return name


def get_schedule(name: str) -> Schedule:
    return _store().get(_named(name))


def list_schedules() -> list[Schedule]:
    return _store().all()


def pause_schedule(name: str) -> Schedule:
    return _store().set_enabled(_named(name), False)


def resume_schedule(name: str) -> Schedule:
    """Enable again from now on: slots that came while paused do not run."""
    return _store().set_enabled(_named(name), True)


def remove_schedule(name: str) -> None:
    _store().remove(_named(name))


@dataclass(frozen=True)
class Backfilled:
    """What a backfill did, so far (``on_progress``) or in all."""

    schedule: str
    slots: int  # in the range
    created: int = 0  # new runs
    existing: int = 0  # slots that had their run already: left as they are
    run_ids: tuple[int, ...] = ()  # each slot's run, in slot order

    @property
    def done(self) -> int:
        return self.created + self.existing

    def as_json(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "slots": self.slots,
            "created": self.created,
            "existing": self.existing,
            "runs": list(self.run_ids),
        }


BACKFILL_CHUNK = 100  # slots written per transaction without --max-running
BACKFILL_POLL = 0.5  # seconds between two looks at the runs out, under max_running


def backfill_schedule(
    name: str,
    start: datetime,
    end: datetime,
    *,
    max_running: int | None = None,
    on_progress: Callable[[Backfilled], None] | None = None,
) -> Backfilled:
    """One run for each of the schedule's slots from ``start`` to ``end`` (both included,
    aware datetimes), in slot order, as the beat would have fired them: a slot that already
    has its run (fired, or an earlier backfill) keeps it, so running the same backfill again
    creates nothing; a schedule that runs after another waits slot by slot for that one's run
    of the latest slot at or before its own. With ``max_running``, at most that many of the
    backfill's runs are unfinished at a time: the next slot's run is created as one ends."""
    if max_running is not None:
        check_whole("max_running", max_running, 1, 10_000, InvalidSchedule)
    schedule = _store().get(_named(name))
    slots = backfill_slots(schedule, start, end)
    settings = services.current().settings
    done = Backfilled(schedule.name, len(slots))
    step = BACKFILL_CHUNK if max_running is None else 1
    out: set[int] = set()
    for at in range(0, len(slots), step):
        if max_running is not None:
            out = _wait_for_room(out, max_running)
        # no deadline: a slot's delay tolerance counts from its slot, long past for a backfill
        runs = tracing.slot_runs(
            [
                replace(run, delay_tolerance=None)
                for run in slot_runs(schedule, slots[at : at + step], settings.max_children)
            ]
        )
        fired = _store().backfill(schedule.name, runs)
        for run_id, run in fired.created:
            _send(run_id, run)
        made = fired.created + fired.held
        out |= {run_id for run_id, _ in made}
        ids = sorted(made + fired.existing, key=lambda found: found[1].slot or start)
        done = Backfilled(
            schedule.name,
            len(slots),
            done.created + len(made),
            done.existing + len(fired.existing),
            done.run_ids + tuple(run_id for run_id, _ in ids),
        )
        if on_progress is not None:
            on_progress(done)
    return done


def _wait_for_room(out: set[int], most: int) -> set[int]:
    """``out`` without the runs that finished, once fewer than ``most`` are left."""
    runs = services.store().runs
    while True:
        out = out - runs.finished_among(sorted(out)) if out else out
        if len(out) < most:
            return out
        time.sleep(BACKFILL_POLL)


def _send(run_id: int, run: NewRun) -> None:
    from dtask.worker.messages import send_master  # Celery: loaded by the commands that send

    slot = iso(run.slot) if run.slot else "?"
    try:
        send_master(run_id, shown=f"{run.template} run {run_id} schedule {run.schedule} {slot}")
    except DtaskError as exc:  # the run is written: a reaper starts it
        log.warning(
            "backfill of %s: slot %s is run %s, pending: %s", run.schedule, slot, run_id, exc
        )
