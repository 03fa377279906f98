"""`dtask beat` (or ``celery -A proj beat -S dtask.worker.beat:DatabaseScheduler``): Celery
beat driven by the schedules in PostgreSQL, and by the app's own ``beat_schedule`` entries.

Every pass (at least once a second, so changes show within a second or two) decides each
enabled schedule's due slots under a row lock and inserts their runs with the trigger key
``schedule:<name>:<slot>``: any number of beats may run, and each slot fires once. Masters are
woken after the pass commits; a beat that dies in between leaves a pending run that a worker's
reaper starts.

The app's own ``beat_schedule`` entries run as Celery's default scheduler runs them (in
memory, from when this beat started), by one beat at a time: the one holding the lease
``beat_schedule`` in PostgreSQL, renewed every pass, taken over by another beat within
``ENTRIES_LEASE`` seconds of its holder dying or freezing. With DTASK_BEAT_APP_ENTRIES off
this beat leaves them (and Celery's default entries) to another beat, django-celery-beat's
say, and fires only dtask's schedules.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from datetime import datetime, timedelta
from typing import Any

from celery.beat import Scheduler

from dtask import services, templating, tracing
from dtask.db.schedules import Firing
from dtask.domain.backfill import slot_runs
from dtask.domain.runs import NewRun
from dtask.domain.schedules import Schedule, Tick, iso
from dtask.exceptions import DtaskError
from dtask.worker.messages import send_master

log = logging.getLogger("dtask.beat")
MAX_SLEEP = 1.0
# A frozen beat (SIGSTOP, a paused VM) holds its schedules' row locks until PostgreSQL ends its
# session after this long idle: slots wait up to that long, under the default 10 s grace.
HOLD_FOR = 3.0
NO_SLOT_LOOK = timedelta(days=1)  # an ended schedule (no next slot) is looked at again
ENTRIES_LEASE = 15.0  # above a pass that waits out a network timeout (8 s)
ENTRIES = "beat_schedule"  # the lease's name


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
        # a buffered slot waits on its previous run: looked at on every pass until it fires;
        # a schedule that has ended (no next slot) is looked at again in a day
        due_at = None if tick.buffered is not None else upcoming or now + NO_SLOT_LOOK
        missed, missed_slots = _missed(schedule, tick)
        if not tick.fire:
            _explain(schedule, tick)
            return Firing(
                [], tick.decided_until, tick.buffered, changed=tick.changed,
                missed=missed, missed_slots=missed_slots, due_at=due_at,
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
            runs, tick.decided_until, tick.buffered, missed=missed, missed_slots=missed_slots,
            due_at=due_at,
        )  # fmt: skip


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
    return tracing.slot_runs(
        slot_runs(schedule, tick.fire, services.current().settings.max_children)
    )


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
    if fired.next_due is not None and fired.now is not None:
        current.wake_in = min(current.wake_in, (fired.next_due - fired.now).total_seconds())
    for run_id, run in fired.held:
        slot = iso(run.slot) if run.slot else "?"
        waits = f"waits for run {run.after[0]}" if run.after else f"failed: {run.unmet}"
        log.info(
            "schedule %s: slot %s triggered run %s, which %s", run.schedule, slot, run_id, waits
        )
    for run_id, run in fired.created:
        slot = iso(run.slot) if run.slot else "?"
        try:
            send_master(run_id, shown=f"{run.template} run {run_id} schedule {run.schedule} {slot}")
        except DtaskError as exc:
            log.warning(
                "schedule %s: slot %s is run %s, pending until a reaper starts it: %s",
                run.schedule, slot, run_id, exc,
            )  # fmt: skip
        else:
            log.info("schedule %s: slot %s triggered run %s", run.schedule, slot, run_id)
    return max(0.01, min(current.wake_in, MAX_SLEEP))


class DatabaseScheduler(Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler for dtask's schedules in PostgreSQL and, unless
    DTASK_BEAT_APP_ENTRIES is off, the app's own ``beat_schedule`` entries (the module's
    docstring says how each runs once)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leading = False
        self.app_entries = services.current().settings.beat_app_entries
        super().__init__(*args, **kwargs)
        self.max_interval = MAX_SLEEP

    def setup_schedule(self) -> None:
        templating.load_templates()
        entries = ", ".join(sorted(self.app.conf.beat_schedule)) or "none now"
        if not self.app_entries:  # self.schedule stays empty: no lease, nothing of the app's
            log.info(
                "beat: the app's beat_schedule entries (%s) are left to another beat"
                " (DTASK_BEAT_APP_ENTRIES is off); this beat fires dtask's schedules",
                entries,
            )
            return
        super().setup_schedule()  # the app's beat_schedule (and Celery's default entries)
        other = _other_scheduler(self.app.conf.beat_scheduler)
        if other is not None and self.app.conf.beat_schedule:
            log.warning(
                "beat: this beat sends the app's beat_schedule entries (%s), and the app names"
                " another scheduler for them (beat_scheduler = %s): if that beat runs too, each"
                " entry is sent twice; set DTASK_BEAT_APP_ENTRIES=0 to leave them to it",
                entries,
                other,
            )

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leading = bool(self.schedule) and self._lead()  # renewed before a pass that may block
        try:
            wait = beat_pass()
        except Exception:  # Celery's beat loop would die; the next pass may well succeed
            log.exception("beat: pass failed; trying again in %g s", MAX_SLEEP)
            wait = MAX_SLEEP
        if self.schedule:
            if leading:
                wait = min(wait, super().tick(*args, **kwargs))
            else:
                self._follow()
        return wait

    def _follow(self) -> None:
        """Advance the entries that fell due without sending them (another beat did), so a
        take-over sends what falls due next, not every entry at once."""
        for name, entry in list(self.schedule.items()):
            if entry.is_due()[0]:
                self.schedule[name] = next(entry)
        self._heap = None  # rebuilt from the advanced entries when this beat leads

    def _lead(self) -> bool:
        """Whether this beat runs the app's entries now (the lease, taken or renewed)."""
        try:
            leading = services.store().leases.hold(ENTRIES, self.holder, ENTRIES_LEASE)
        except DtaskError as exc:
            log.warning("beat: cannot renew the lease on the app's entries: %s", exc)
            leading = False
        if leading != self.leading:
            log.info(
                "beat: %s the app's beat_schedule entries (%s)",
                "running" if leading else "no longer running",
                ", ".join(sorted(self.schedule)),
            )
            self.leading = leading
        return leading

    def close(self) -> None:
        super().close()
        if self.leading:
            try:
                services.store().leases.release(ENTRIES, self.holder)
            except DtaskError as exc:  # it lapses by itself
                log.warning("beat: could not hand the app's entries over: %s", exc)

    @property
    def info(self) -> str:
        if not self.app_entries:
            entries = "the app's beat_schedule left to another beat (DTASK_BEAT_APP_ENTRIES=0)"
            return f"    . schedules -> dtask_schedules in PostgreSQL; {entries}"
        entries = f"{len(self.schedule)} entries of beat_schedule (one beat at a time)"
        return f"    . schedules -> dtask_schedules in PostgreSQL, and {entries}"


_NOT_OTHERS = ("dtask.worker.beat.DatabaseScheduler", "celery.beat.PersistentScheduler")


def _other_scheduler(configured: object) -> str | None:
    """The scheduler the app's configuration names for its beat, when it is neither Celery's
    default nor this one (django-celery-beat's: a beat of its own sends the entries)."""
    if not configured:
        return None
    if isinstance(configured, type):
        if issubclass(configured, DatabaseScheduler):
            return None
        configured = f"{configured.__module__}:{configured.__qualname__}"
    name = str(configured)
    return None if name.replace(":", ".") in _NOT_OTHERS else name
