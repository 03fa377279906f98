"""`/api/v1/schedules`: the same verbs as `dtask schedule` (admin tokens: a schedule's runs
belong to the client ``default``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api.auth import Admin
from dtask.client import schedules as scheduling
from dtask.domain.schedules import CATCH_UP_WINDOW, GRACE, Schedule, iso, zone
from dtask.exceptions import ScheduleNotFound

router = APIRouter(prefix="/schedules", tags=["schedules"])


class ScheduleBody(BaseModel):
    """A schedule's definition, as `dtask schedule add` takes it."""

    model_config = ConfigDict(extra="forbid")

    template: str
    variables: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = None
    every: int | None = Field(None, description="seconds")
    tz: str = "UTC"
    misfire: str = "skip"
    overlap: str = "allow"
    grace: float = GRACE
    catch_up_window: float = CATCH_UP_WINDOW
    start: datetime | None = Field(None, description="ISO 8601; without an offset, in tz")
    end: datetime | None = None
    delay_tolerance: float | None = None
    on_late: str | None = None
    after_schedule: str | None = Field(None, description="its slots wait for this schedule's")


def shown(schedule: Schedule) -> dict[str, Any]:
    """What `dtask schedule show --json` prints, with its latest runs."""
    latest = services.store().runs.statuses(limit=5, schedule=schedule.name)
    row = schedule.as_json(datetime.now(UTC))
    row["latest_runs"] = [
        {"id": s.id, "slot": iso(s.slot) if s.slot else None, "state": s.state.value}
        for s in latest
    ]
    return row


def _aware(moment: datetime | None, tz: str) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=zone(tz))


def _put(name: str, body: ScheduleBody) -> tuple[dict[str, Any], bool]:
    try:
        scheduling.get_schedule(name)
        existed = True
    except ScheduleNotFound:
        existed = False
    saved = scheduling.add_schedule(
        name, body.template, body.variables, replace=True,
        cron=body.cron, every=body.every, tz=body.tz, misfire=body.misfire,
        overlap=body.overlap, grace=body.grace, catch_up_window=body.catch_up_window,
        start=_aware(body.start, body.tz), end=_aware(body.end, body.tz),
        delay_tolerance=body.delay_tolerance, on_late=body.on_late,
        after_schedule=body.after_schedule,
    )  # fmt: skip
    return shown(saved), not existed


@router.get("")
async def list_schedules(token: Admin) -> list[dict[str, Any]]:
    """Every schedule with its next five slots and latest runs."""
    return await run_in_threadpool(lambda: [shown(s) for s in scheduling.list_schedules()])


@router.get("/{name}")
async def read_schedule(name: str, token: Admin) -> dict[str, Any]:
    """The schedule, its next slots and its latest runs."""
    return await run_in_threadpool(lambda: shown(scheduling.get_schedule(name)))


@router.put("/{name}")
async def put_schedule(
    name: str, body: ScheduleBody, token: Admin, response: Response
) -> dict[str, Any]:
    """Create (201) or replace (200) the schedule; slots already decided keep their runs."""
    row, created = await run_in_threadpool(_put, name, body)
    response.status_code = 201 if created else 200
    return row


@router.delete("/{name}", status_code=204)
async def delete_schedule(name: str, token: Admin) -> None:
    """Remove the schedule (its runs stay)."""
    await run_in_threadpool(scheduling.remove_schedule, name)


@router.post("/{name}/pause")
async def pause_schedule(name: str, token: Admin) -> dict[str, Any]:
    return await run_in_threadpool(lambda: shown(scheduling.pause_schedule(name)))


@router.post("/{name}/resume")
async def resume_schedule(name: str, token: Admin) -> dict[str, Any]:
    """Enabled again from now on: slots that came while paused do not run."""
    return await run_in_threadpool(lambda: shown(scheduling.resume_schedule(name)))


class BackfillBody(BaseModel):
    """A range of the schedule's slots to run, both ends included."""

    model_config = ConfigDict(extra="forbid")

    start: datetime = Field(alias="from", description="ISO 8601; without an offset, in its tz")
    end: datetime = Field(alias="to")


def _backfill(name: str, body: BackfillBody) -> dict[str, Any]:
    tz = scheduling.get_schedule(name).timing.tz
    start, end = _aware(body.start, tz), _aware(body.end, tz)
    assert start is not None and end is not None
    return scheduling.backfill_schedule(name, start, end).as_json()


@router.post("/{name}/backfill")
async def backfill_schedule(name: str, body: BackfillBody, token: Admin) -> dict[str, Any]:
    """One run for each slot from ``from`` to ``to`` (at most 10,000), in slot order, each
    once (a slot that has its run keeps it); ``{"schedule", "slots", "created", "existing",
    "runs"}``. `dtask schedule backfill --max-running` paces them; here they all start and
    queue under the dispatcher's limits."""
    return await run_in_threadpool(_backfill, name, body)
