"""Managing schedules: create or replace, list, pause, resume, remove.

Variables are checked against the template when the schedule is saved, not when it fires.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dtask import services
from dtask.db.schedules import ScheduleStore
from dtask.domain.schedules import Misfire, Overlap, Schedule, make_timing
from dtask.domain.templates import registry


def _store() -> ScheduleStore:
    return services.store().schedules


def add_schedule(
    name: str,
    template: str,
    variables: dict[str, Any],
    *,
    cron: str | None = None,
    every: int | None = None,
    tz: str = "UTC",
    misfire: str = Misfire.SKIP.value,
    overlap: str = Overlap.ALLOW.value,
    grace: float = 10.0,
    catch_up_window: float = 86400.0,
    start: datetime | None = None,
    end: datetime | None = None,
    replace: bool = False,
) -> Schedule:
    """Save a schedule whose first slot comes after now. Saving the same definition again is
    a no-op; a different one raises ScheduleExists unless ``replace``."""
    tpl = registry.get(template)
    checked = tpl.validate(variables)
    tpl.precheck(checked, services.current().settings.max_children)
    timing = make_timing(
        cron=cron,
        every=every,
        tz=tz,
        misfire=misfire,
        overlap=overlap,
        grace=grace,
        catch_up_window=catch_up_window,
        start_at=start,
        end_at=end,
        now=datetime.now(UTC),
    )
    saved, _ = _store().save(Schedule(name, tpl.name, checked, timing), replace=replace)
    return saved


def get_schedule(name: str) -> Schedule:
    return _store().get(name)


def list_schedules() -> list[Schedule]:
    return _store().all()


def pause_schedule(name: str) -> Schedule:
    return _store().set_enabled(name, False)


def resume_schedule(name: str) -> Schedule:
    """Enable again from now on: slots that came while paused do not run."""
    return _store().set_enabled(name, True)


def remove_schedule(name: str) -> None:
    _store().remove(name)
