"""Schedules: cron and interval triggers, their slots, misfire and overlap rules.

Pure: no Celery, no SQL. A *slot* is an aware UTC datetime at which a schedule is due; a slot
fires at most once because its trigger key (``schedule:<name>:<slot>``) is unique in PostgreSQL.
Cron expressions and their DST rules are in ``dtask.domain.cron``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol, TypedDict, TypeVar, Unpack
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dtask.domain.cron import Cron
from dtask.domain.deadlines import OnLate, check_delay_tolerance, on_late_of
from dtask.domain.limits import EARLIEST, LATEST, shown, text_problem
from dtask.exceptions import InvalidSchedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Misfire(StrEnum):
    """What to do with slots that passed while no beat was running."""

    SKIP = "skip"
    RUN_ONCE = "run_once"
    CATCH_UP = "catch_up"


class Overlap(StrEnum):
    """What to do with a slot that comes while the schedule's previous run is still going."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


P = TypeVar("P", Misfire, Overlap)


def policy(kind: type[P], value: str) -> P:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(p.value for p in kind)
        raise InvalidSchedule(
            f"{kind.__name__.lower()} policy must be one of {allowed}, got {value!r}"
        ) from None


ZONE_NAME = 64  # dtask_schedules.timezone


def zone(name: str) -> ZoneInfo:
    try:
        if len(name) > ZONE_NAME or text_problem(name) is not None:
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: e.g. a name too long
        raise InvalidSchedule(
            f"unknown time zone {name[:ZONE_NAME]!r} (use an IANA name such as UTC or"
            " Europe/Berlin)"
        ) from None


def trigger_key(schedule: str, slot: datetime) -> str:
    return f"schedule:{schedule}:{iso(slot)}"


def iso(slot: datetime) -> str:
    """A slot in UTC ISO 8601, e.g. 2026-11-22T12:00:00Z."""
    utc = slot.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{utc.microsecond:06d}Z" if utc.microsecond else f"{text}Z"


# --- triggers -------------------------------------------------------------------------------


class Trigger(Protocol):
    def slots(self, after: datetime) -> Iterator[datetime]: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class CronTrigger:
    cron: Cron
    tz: ZoneInfo

    def describe(self) -> str:
        return f"{self.cron.describe()} ({self.tz.key})"

    def slots(self, after: datetime) -> Iterator[datetime]:
        return self.cron.slots(after, self.tz)


@dataclass(frozen=True)
class Every:
    """Every ``seconds`` of real time, counted from ``anchor`` (time zones do not matter)."""

    seconds: int
    anchor: datetime = EPOCH

    def describe(self) -> str:
        return f"every {self.seconds} s"

    def slots(self, after: datetime) -> Iterator[datetime]:
        """The slots strictly after ``after``, ascending, until time runs out at year 9999."""
        step = timedelta(seconds=self.seconds)
        try:
            slot = self.anchor + ((after - self.anchor) // step + 1) * step
            while True:
                yield slot
                slot += step
        except OverflowError:
            return

    def latest_slot(self, until: datetime) -> datetime:
        step = timedelta(seconds=self.seconds)
        return self.anchor + ((until - self.anchor) // step) * step


# --- a schedule's timing: slots, misfires and overlaps --------------------------------------


GRACE = 10.0  # seconds late before a slot counts as missed
CATCH_UP_WINDOW = 86400.0  # how far back misfire catch_up reaches
MIN_GRACE = 2.0
MAX_SECONDS = 366 * 86400


def _within(what: str, value: object, low: float, high: float) -> None:
    try:
        inside = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and low <= value <= high
        )
    except OverflowError:  # an integer past any float
        inside = False
    if not inside:
        got = f"{value:g}" if isinstance(value, float) else shown(value)
        raise InvalidSchedule(f"{what} must be {low:g} to {high:.0f} seconds, got {got}")


@dataclass(frozen=True)
class Tick:
    """What one beat pass decides for one schedule."""

    fire: tuple[datetime, ...]  # slots to trigger now, oldest first
    decided_until: datetime  # every slot up to here is decided (fired, dropped or buffered)
    buffered: datetime | None  # buffer_one: the slot waiting for the running run to finish
    missed: tuple[datetime, datetime] | None = None  # (after, until): slots there were missed
    overlapping: tuple[datetime, ...] = ()  # slots dropped by the overlap policy
    changed: bool = False  # False: nothing was due; the schedule's row need not be written


class When(TypedDict, total=False):
    """When a schedule fires, as a user writes it: the keyword arguments of
    ``dtask.add_schedule`` (and of ``Template.schedule``), checked by ``make_timing``."""

    cron: str | None  # exactly one of cron and every
    every: int | None  # seconds
    tz: str
    misfire: str  # a Misfire value
    overlap: str  # an Overlap value
    grace: float
    catch_up_window: float
    start: datetime | None
    end: datetime | None
    delay_tolerance: float | None  # seconds after its slot a run's first child may start
    on_late: str | None  # "run" or "fail"; None: the template's


@dataclass(frozen=True)
class Timing:
    trigger: Cron | int  # a cron expression, or an interval in seconds
    tz: str = "UTC"
    misfire: Misfire = Misfire.SKIP
    overlap: Overlap = Overlap.ALLOW
    grace: float = GRACE
    catch_up_window: float = CATCH_UP_WINDOW
    start_at: datetime | None = None
    end_at: datetime | None = None
    delay_tolerance: float | None = None  # None: the template's
    on_late: OnLate | None = None  # None: the template's

    def __post_init__(self) -> None:
        zone(self.tz)
        check_delay_tolerance(self.delay_tolerance, "schedule")
        if isinstance(self.trigger, int):
            _within("an interval", self.trigger, 1, MAX_SECONDS)
        # Under ~2 s a healthy beat's own delay would count as a misfire.
        _within("the misfire grace", self.grace, MIN_GRACE, 86400)
        _within("the catch-up window", self.catch_up_window, 1, MAX_SECONDS)
        for moment in (self.start_at, self.end_at):
            if moment is not None and moment.tzinfo is None:
                raise InvalidSchedule(f"start and end need a time zone, got {moment.isoformat()}")
            if moment is not None and not EARLIEST <= moment <= LATEST:
                raise InvalidSchedule(
                    f"start and end must lie between {EARLIEST.year} and {LATEST.year - 1},"
                    f" got {moment.isoformat()}"
                )
        if self.start_at and self.end_at and self.start_at >= self.end_at:
            raise InvalidSchedule("the schedule's end must come after its start")

    def when(self) -> When:
        """This timing as a user writes it: ``make_timing(**timing.when())`` gives it back."""
        return When(
            cron=self.cron,
            every=self.every,
            tz=self.tz,
            misfire=self.misfire.value,
            overlap=self.overlap.value,
            grace=self.grace,
            catch_up_window=self.catch_up_window,
            start=self.start_at,
            end=self.end_at,
            delay_tolerance=self.delay_tolerance,
            on_late=None if self.on_late is None else self.on_late.value,
        )

    @property
    def cron(self) -> str | None:
        return self.trigger.expression if isinstance(self.trigger, Cron) else None

    @property
    def every(self) -> int | None:
        return self.trigger if isinstance(self.trigger, int) else None

    @property
    def source(self) -> Trigger:
        if isinstance(self.trigger, Cron):
            return CronTrigger(self.trigger, zone(self.tz))
        return Every(self.trigger, self.start_at or EPOCH)

    def describe(self) -> str:
        return self.source.describe()

    def next_slot(self, after: datetime) -> datetime | None:
        return next(self._walk(after), None)

    def slots(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Up to ``limit`` slots in (after, until], oldest first."""
        due = itertools.takewhile(lambda slot: slot <= until, self._walk(after))
        return list(itertools.islice(due, limit))

    def upcoming(self, after: datetime, count: int) -> Iterator[datetime]:
        return itertools.islice(self._walk(after), count)

    def _walk(self, after: datetime) -> Iterator[datetime]:
        """The slots after ``after``, within the start and the end, ascending."""
        if self.start_at is not None and after < self.start_at:
            after = self.start_at - timedelta(microseconds=1)
        for slot in self.source.slots(after):
            if self.end_at is not None and slot > self.end_at:
                return
            yield slot

    def latest_slot(self, after: datetime, until: datetime) -> datetime | None:
        """The last slot in (after, until], mostly without walking every slot from ``after``."""
        source = self.source
        if isinstance(source, Every):
            if self.end_at is not None:
                until = min(until, self.end_at)
            slot = source.latest_slot(until)
            starts = self.start_at or after
            return slot if slot > after and slot >= starts else None
        shortcut = isinstance(source, CronTrigger) and source.cron.start_independent(
            source.tz, after, until
        )
        reach = timedelta(hours=1)
        while True:
            low = max(after, until - reach) if shortcut else after
            due = itertools.takewhile(lambda slot: slot <= until, self._walk(low))
            latest = next(iter(deque(due, maxlen=1)), None)
            if latest is not None or low == after:
                return latest
            reach *= 8

    def plan(
        self,
        decided_until: datetime,
        now: datetime,
        buffered: datetime | None,
        previous_running: bool,
        limit: int = 100,
    ) -> Tick:
        """Decide the slots in (decided_until, now]: which fire now, which are dropped.

        A slot more than ``grace`` seconds late was missed (no beat ran at its time) and is
        handled by the misfire policy; the others are on time. Then the overlap policy decides
        against the schedule's previous run (``previous_running``). At most ``limit`` slots
        are decided per pass; the rest wait for the next one.
        """
        now = max(now, decided_until)  # another pass may have decided past this one's clock
        on_time_from = now - timedelta(seconds=self.grace)
        candidates: list[datetime] = []
        missed = None
        first = self.next_slot(decided_until)
        if first is not None and first <= on_time_from:
            missed = (decided_until, on_time_from)
            if self.misfire is Misfire.CATCH_UP:
                oldest = max(decided_until, now - timedelta(seconds=self.catch_up_window))
                candidates += self.slots(oldest, on_time_from, limit + 1)
            elif self.misfire is Misfire.RUN_ONCE:
                latest = self.latest_slot(decided_until, on_time_from)
                candidates += [latest] if latest is not None else []
        candidates += self.slots(max(decided_until, on_time_from), now, limit + 1)
        until = now
        if len(candidates) > limit:
            candidates = candidates[:limit]
            until = candidates[-1]
            if missed is not None and until < missed[1]:
                missed = (decided_until, until)
        fire, overlapping, still = self._overlap(candidates, buffered, previous_running)
        changed = bool(candidates) or missed is not None or still != buffered
        return Tick(tuple(fire), until, still, missed, tuple(overlapping), changed)

    def _overlap(
        self, candidates: list[datetime], buffered: datetime | None, running: bool
    ) -> tuple[list[datetime], list[datetime], datetime | None]:
        fire: list[datetime] = []
        dropped: list[datetime] = []
        if self.overlap is not Overlap.ALLOW:  # one run at a time: of slots due together,
            dropped, candidates = candidates[:-1], candidates[-1:]  # only the newest counts
        if buffered is not None and (not running or self.overlap is Overlap.ALLOW):
            fire.append(buffered)
            buffered, running = None, True
        for slot in candidates:
            if self.overlap is Overlap.ALLOW or not running:
                fire.append(slot)
                running = True
            elif self.overlap is Overlap.BUFFER_ONE and buffered is None:
                buffered = slot
            else:
                dropped.append(slot)
        return fire, dropped, buffered


def make_timing(*, now: datetime | None = None, **when: Unpack[When]) -> Timing:
    """Check a schedule's definition as a user wrote it; raise InvalidSchedule naming the fault."""
    unknown = sorted(set(when) - When.__optional_keys__)
    if unknown:  # **when is checked by mypy only: a typo must not silently drop an option
        known = ", ".join(sorted(When.__optional_keys__))
        raise InvalidSchedule(f"unknown schedule option(s) {', '.join(unknown)} (known: {known})")
    cron, every = when.get("cron"), when.get("every")
    if (cron is None) == (every is None):
        raise InvalidSchedule("a schedule needs exactly one of a cron expression or an interval")
    if every is not None:
        _within("an interval", every, 1, MAX_SECONDS)
    start, end = when.get("start"), when.get("end")
    timing = Timing(
        trigger=Cron.parse(cron) if cron is not None else int(every or 0),
        tz=when.get("tz", "UTC"),
        misfire=policy(Misfire, when.get("misfire", Misfire.SKIP.value)),
        overlap=policy(Overlap, when.get("overlap", Overlap.ALLOW.value)),
        grace=when.get("grace", GRACE),
        catch_up_window=when.get("catch_up_window", CATCH_UP_WINDOW),
        start_at=start,
        end_at=end,
        delay_tolerance=when.get("delay_tolerance"),
        on_late=_on_late(when.get("on_late")),
    )
    if timing.next_slot(now or datetime.now(UTC)) is None:
        bounded = " within its start and end" if start or end else ""
        raise InvalidSchedule(f"schedule {timing.describe()} never fires{bounded}")
    return timing


def _on_late(text: str | None) -> OnLate | None:
    return None if text is None else on_late_of(text, "schedule")


SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


@dataclass(frozen=True)
class Schedule:
    """A named schedule: which template to trigger with which variables, and when."""

    name: str
    template: str
    variables: dict[str, Any]
    timing: Timing
    enabled: bool = True
    decided_until: datetime | None = None
    buffered: datetime | None = None
    last_run_id: int | None = None
    last_error: str | None = None
    # each slot's run waits for this schedule's run of the latest slot at or before it
    after_schedule: str | None = None

    def __post_init__(self) -> None:
        for name in (self.name, self.after_schedule):
            if name is not None and not SCHEDULE_NAME.fullmatch(name):
                raise InvalidSchedule(
                    f"schedule name {name!r} must be 1-100 letters, digits or _ . -"
                )
        if self.after_schedule == self.name:
            raise InvalidSchedule(f"schedule {self.name!r} cannot run after itself")

    def same_definition(self, other: Schedule) -> bool:
        return (
            self.name, self.template, self.variables, self.timing, self.after_schedule
        ) == (
            other.name, other.template, other.variables, other.timing, other.after_schedule
        )  # fmt: skip

    def as_json(self, now: datetime) -> dict[str, Any]:
        timing = self.timing
        return {
            "name": self.name,
            "template": self.template,
            "variables": self.variables,
            **timing.when(),
            "start": _iso_or_none(timing.start_at),
            "end": _iso_or_none(timing.end_at),
            "enabled": self.enabled,
            "next_slots": [iso(s) for s in timing.upcoming(now, 5)] if self.enabled else [],
            "buffered": _iso_or_none(self.buffered),
            "last_run_id": self.last_run_id,
            "last_error": self.last_error,
            "after_schedule": self.after_schedule,
        }


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else iso(moment)
