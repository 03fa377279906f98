"""Managing schedules: create or replace, list, pause, resume, remove.

Variables are checked against the template when the schedule is saved, not when it fires.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Unpack

from dtask import services
from dtask.db.schedules import ScheduleStore
from dtask.domain.schedules import SCHEDULE_NAME, Schedule, When, make_timing
from dtask.domain.templates import registry
from dtask.exceptions import ScheduleNotFound


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
