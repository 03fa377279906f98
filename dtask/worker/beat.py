"""`dtask beat`: Celery beat driven by the schedules in PostgreSQL.

Every pass (at least once a second, so changes show within a second or two) decides each
enabled schedule's due slots under a row lock and inserts their runs with the trigger key
``schedule:<name>:<slot>``: any number of beats may run, and each slot fires once. Masters are
woken after the pass commits; a beat that dies in between leaves a pending run that a worker's
reaper starts.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery.beat import Scheduler

from dtask import services
from dtask.db import NewRun
from dtask.db.schedules import Firing
from dtask.domain.clients import Tier
from dtask.domain.schedules import Schedule, Tick, iso, trigger_key
from dtask.domain.templates import registry
from dtask.domain.tiers import tier_queue
from dtask.exceptions import DtaskError
from dtask.worker.dispatch import send_master

log = logging.getLogger("dtask.beat")
MAX_SLEEP = 1.0
# A frozen beat (SIGSTOP, a paused VM) holds its schedules' row locks until PostgreSQL ends its
# session after this long idle: slots wait up to that long, under the default 10 s grace.
HOLD_FOR = 3.0


class Pass:
    """One beat pass: decides every schedule, then says how long to sleep."""

    def __init__(self) -> None:
        self.wake_in = MAX_SLEEP

    def decide(self, schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        try:
            return self._decide(schedule, now, previous_running)
        except Exception as exc:  # one broken schedule must not stop the others or the beat
            return _failed(schedule, f"{type(exc).__name__}: {exc}")

    def _decide(self, schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        assert schedule.decided_until is not None
        tick = schedule.timing.plan(
            schedule.decided_until, now, schedule.buffered, previous_running
        )
        upcoming = schedule.timing.next_slot(tick.decided_until)
        if upcoming is not None:
            self.wake_in = min(self.wake_in, (upcoming - now).total_seconds())
        missed, missed_slots = _missed(schedule, tick)
        if not tick.fire:
            _explain(schedule, tick)
            return Firing(
                [], tick.decided_until, tick.buffered, changed=tick.changed,
                missed=missed, missed_slots=missed_slots,
            )  # fmt: skip
        try:
            runs = _runs(schedule, tick)
        except DtaskError as exc:
            # Decide nothing: the slots stay due, so another beat that knows the template
            # (a rolling deploy) runs them, or the misfire policy handles them once fixed.
            # Name the stable start of the due slots, not the latest: the same error must
            # read the same on every pass, or it is logged and written once a second.
            return _failed(schedule, f"slots after {iso(schedule.decided_until)} not run: {exc}")
        _explain(schedule, tick)
        return Firing(
            runs, tick.decided_until, tick.buffered, missed=missed, missed_slots=missed_slots
        )


MISSED_COUNTED = 1000  # slots counted one by one for the metric; past that, this many


def _missed(schedule: Schedule, tick: Tick) -> tuple[str | None, int]:
    """What was missed, said the way the log says it, and how many slots."""
    if tick.missed is None:
        return None, 0
    after, until = tick.missed
    slots = len(schedule.timing.slots(after, until, MISSED_COUNTED))
    note = (
        f"{slots} slot(s) after {iso(after)} up to {iso(until)} were missed (no beat ran);"
        f" misfire policy {schedule.timing.misfire.value}"
    )
    return note, slots


def _failed(schedule: Schedule, error: str) -> Firing:
    """Leave the schedule as it was, with ``error`` shown (and logged once, not every pass)."""
    assert schedule.decided_until is not None
    changed = error != schedule.last_error
    if changed:
        log.error("schedule %s: %s", schedule.name, error)
    return Firing([], schedule.decided_until, schedule.buffered, error, changed=changed)


def _runs(schedule: Schedule, tick: Tick) -> list[NewRun]:
    """Checked again at fire time: the template's code may have changed since the save."""
    tpl = registry.get(schedule.template)
    variables = tpl.validate(schedule.variables)
    tpl.precheck(variables, services.current().settings.max_children)
    tier = tpl.options.tier or Tier.BASIC
    timing = schedule.timing
    return [
        NewRun(
            template=tpl.name,
            key=trigger_key(schedule.name, slot),
            variables=variables,
            max_attempts=tpl.options.max_attempts,
            queue=tier_queue(tpl.options.queue, tier),
            schedule=schedule.name,
            slot=slot,
            # the deadline: slot + tolerance
            delay_tolerance=timing.delay_tolerance or tpl.options.delay_tolerance,
            on_late=timing.on_late or tpl.options.on_late,
            tier=tier,
        )
        for slot in tick.fire
    ]


def _explain(schedule: Schedule, tick: Tick) -> None:
    name, timing = schedule.name, schedule.timing
    if tick.missed is not None:
        after, until = tick.missed
        log.warning(
            "schedule %s: slots after %s up to %s were missed (no beat ran); misfire policy %s",
            name, iso(after), iso(until), timing.misfire.value,
        )  # fmt: skip
    for slot in tick.overlapping:
        log.info(
            "schedule %s: slot %s dropped, its previous run is still going (overlap %s)",
            name, iso(slot), timing.overlap.value,
        )  # fmt: skip
    if tick.buffered is not None and tick.buffered != schedule.buffered:
        log.info("schedule %s: slot %s waits for the previous run", name, iso(tick.buffered))


def beat_pass() -> float:
    """Run one pass; return the seconds to sleep before the next one."""
    schedules = services.store().schedules
    current = Pass()
    try:
        fired = schedules.beat_pass(current.decide, hold_for=HOLD_FOR)
    except DtaskError as exc:
        log.warning("beat: %s; trying again in %g s", exc, MAX_SLEEP)
        return MAX_SLEEP
    for run_id, run in fired.created:
        slot = iso(run.slot) if run.slot else "?"
        try:
            send_master(run_id)
        except DtaskError as exc:
            log.warning(
                "schedule %s: slot %s is run %s, pending until a reaper starts it: %s",
                run.schedule, slot, run_id, exc,
            )  # fmt: skip
        else:
            log.info("schedule %s: slot %s triggered run %s", run.schedule, slot, run_id)
    return max(0.01, min(current.wake_in, MAX_SLEEP))


class DatabaseScheduler(Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler whose entries are dtask's schedules in PostgreSQL."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_interval = MAX_SLEEP

    def setup_schedule(self) -> None:
        services.load_templates()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        try:
            return beat_pass()
        except Exception:  # Celery's beat loop would die; the next pass may well succeed
            log.exception("beat: pass failed; trying again in %g s", MAX_SLEEP)
            return MAX_SLEEP

    @property
    def info(self) -> str:
        return "    . schedules -> dtask_schedules in PostgreSQL"
