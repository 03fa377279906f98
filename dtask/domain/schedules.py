"""Schedules: cron and interval triggers, their slots in a time zone, misfire and overlap rules.

Pure: no Celery, no SQL. A *slot* is an aware UTC datetime at which a schedule is due; a slot
fires at most once because its trigger key (``schedule:<name>:<slot>``) is unique in PostgreSQL.

Daylight saving time, for cron in a time zone (the rule of Vixie cron and cronie):
- a wall time that does not exist (spring forward) fires at the same offset from the jump,
  e.g. 02:30 in Europe/Berlin on the last Sunday of March fires at 03:30 CEST;
- a wall time that happens twice (fall back) fires once, at its first occurrence,
- except for *wildcard* schedules, whose second, minute or hour field starts with ``*``: they
  follow real time, firing in both passes of a repeated hour and not in a skipped one.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Protocol, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dtask.exceptions import InvalidSchedule

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DST_REACH = timedelta(hours=3)  # larger than any real UTC offset change
_SEARCH_YEARS = 30  # a cron that matches nothing in this many years never fires (e.g. 30 Feb)


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


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(
            f"unknown time zone {name!r} (use an IANA name such as UTC or Europe/Berlin)"
        ) from None


def trigger_key(schedule: str, slot: datetime) -> str:
    return f"schedule:{schedule}:{iso(slot)}"


def iso(slot: datetime) -> str:
    """A slot in UTC ISO 8601, e.g. 2026-11-22T12:00:00Z."""
    utc = slot.astimezone(UTC)
    text = utc.strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{utc.microsecond:06d}Z" if utc.microsecond else f"{text}Z"


# --- cron -----------------------------------------------------------------------------------

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_TERM = re.compile(r"^(?:(\*)|([a-z0-9]+)(?:-([a-z0-9]+))?)(?:/(\d+))?$")


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: Mapping[str, int] = field(default_factory=dict)

    def parse(self, text: str) -> frozenset[int]:
        values: set[int] = set()
        for term in text.lower().split(","):
            match = _TERM.match(term)
            if match is None:
                raise InvalidSchedule(f"cron {self.name} field: cannot read {term!r}")
            star, first, last, step_text = match.groups()
            step = int(step_text) if step_text else 1
            if step < 1:
                raise InvalidSchedule(f"cron {self.name} field: step must be >= 1 in {term!r}")
            if star:
                low, high = self.low, self.high
            else:
                low = self._value(first)
                high = self._value(last) if last else (self.high if step_text else low)
            if low > high:
                raise InvalidSchedule(f"cron {self.name} field: range {term!r} runs backwards")
            values.update(range(low, high + 1, step))
        return frozenset(values)

    def _value(self, token: str) -> int:
        value = self.names.get(token)
        if value is None:
            if not token.isdigit():
                raise InvalidSchedule(f"cron {self.name} field: unknown value {token!r}")
            value = int(token)
        if not self.low <= value <= self.high:
            raise InvalidSchedule(
                f"cron {self.name} field: {value} is outside {self.low}-{self.high}"
            )
        return value


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DOM = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, {m: i + 1 for i, m in enumerate(_MONTHS)})
_DOW = _Field("day-of-week", 0, 7, {d: i for i, d in enumerate(_DAYS)})


@dataclass(frozen=True)
class Cron:
    """``minute hour day-of-month month day-of-week``, or six fields with seconds first.

    ``*``, ``a-b``, ``*/n``, ``a-b/n``, lists, month and day names, 0 or 7 for Sunday, and the
    @hourly/@daily/@weekly/@monthly/@yearly macros. When both day fields are restricted (do not
    start with ``*``) a day matches if either does, as in Vixie cron.
    """

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool
    wildcard: bool  # follows real time across DST changes (see the module's docstring)

    @classmethod
    def parse(cls, expression: str) -> Cron:
        text = _MACROS.get(expression.strip().lower(), expression)
        parts = text.split()
        if len(parts) == 5:
            parts = ["0", *parts]
        if len(parts) != 6:
            raise InvalidSchedule(
                f"cron {expression!r} must have 5 fields (minute hour day month weekday)"
                " or 6 with seconds first"
            )
        second, minute, hour, dom, month, dow = parts
        return cls(
            expression=expression.strip(),
            seconds=_SECOND.parse(second),
            minutes=_MINUTE.parse(minute),
            hours=_HOUR.parse(hour),
            days=_DOM.parse(dom),
            months=_MONTH.parse(month),
            weekdays=frozenset(d % 7 for d in _DOW.parse(dow)),
            days_restricted=not dom.startswith("*"),
            weekdays_restricted=not dow.startswith("*"),
            wildcard=any(f.startswith("*") for f in (second, minute, hour)),
        )

    def describe(self) -> str:
        return f"cron {self.expression}"

    def _day_matches(self, day: date) -> bool:
        in_month = day.day in self.days
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return in_month or in_week
        return in_month and in_week

    def next_wall(self, after: datetime) -> datetime | None:
        """The first naive wall time after ``after`` that matches every field."""
        t = after.replace(microsecond=0) + timedelta(seconds=1)
        last_year = after.year + _SEARCH_YEARS
        while t.year <= last_year:
            if t.month not in self.months:
                t = datetime(t.year + t.month // 12, t.month % 12 + 1, 1)
            elif not self._day_matches(t.date()):
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
            elif (hour := _at_or_after(self._sorted.hours, t.hour)) != t.hour:
                day = datetime(t.year, t.month, t.day)
                t = day + timedelta(days=1) if hour is None else day.replace(hour=hour)
            elif (minute := _at_or_after(self._sorted.minutes, t.minute)) != t.minute:
                top = t.replace(minute=0, second=0)
                t = top + timedelta(hours=1) if minute is None else top.replace(minute=minute)
            elif (second := _at_or_after(self._sorted.seconds, t.second)) != t.second:
                top = t.replace(second=0)
                t = top + timedelta(minutes=1) if second is None else top.replace(second=second)
            else:
                return t
        return None

    @cached_property
    def _sorted(self) -> _Sorted:
        return _Sorted(sorted(self.hours), sorted(self.minutes), sorted(self.seconds))


@dataclass(frozen=True)
class _Sorted:
    hours: list[int]
    minutes: list[int]
    seconds: list[int]


def _at_or_after(values: list[int], value: int) -> int | None:
    i = bisect_left(values, value)
    return values[i] if i < len(values) else None


def _instants(wall: datetime, tz: ZoneInfo, wildcard: bool) -> list[datetime]:
    """The UTC instants at which a matching wall time fires (see the module's DST rules)."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    exists = first.astimezone(tz).replace(tzinfo=None) == wall
    if not exists:  # skipped by a spring-forward jump; fold=0 shifts it past the jump
        return [] if wildcard else [first]
    if first != second:  # a fall-back repeat
        return [first, second] if wildcard else [first]
    return [first]


def _offsets(tz: ZoneInfo, instant: datetime) -> tuple[timedelta, timedelta]:
    """The smallest and largest UTC offset of ``tz`` within a few hours of ``instant``."""
    offsets = [
        (instant + d).astimezone(tz).utcoffset() or timedelta(0)
        for d in (-_DST_REACH, timedelta(0), _DST_REACH)
    ]
    return min(offsets), max(offsets)


def _naive(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None)


# --- triggers -------------------------------------------------------------------------------


class Trigger(Protocol):
    def next_slot(self, after: datetime) -> datetime | None: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class CronTrigger:
    cron: Cron
    tz: ZoneInfo

    def describe(self) -> str:
        return f"{self.cron.describe()} ({self.tz.key})"

    def next_slot(self, after: datetime) -> datetime | None:
        """The first slot strictly after ``after`` (aware), as an aware UTC datetime."""
        tz, cron = self.tz, self.cron
        # A wall time w fires at w - offset(w). Offsets change near a DST jump, so the walls
        # worth trying run from after + the smallest nearby offset up to best + the largest.
        low, _ = _offsets(tz, after)
        wall = cron.next_wall(_naive(after + low))
        best: datetime | None = None
        bound: datetime | None = None
        while (w := wall) is not None and (bound is None or w < bound):
            wall = cron.next_wall(w)
            for instant in _instants(w, tz, cron.wildcard):
                if instant > after and (best is None or instant < best):
                    best = instant
                    bound = _naive(best + _offsets(tz, best)[1])
        return best


@dataclass(frozen=True)
class Every:
    """Every ``seconds`` of real time, counted from ``anchor`` (time zones do not matter)."""

    seconds: int
    anchor: datetime = EPOCH

    def describe(self) -> str:
        return f"every {self.seconds} s"

    def next_slot(self, after: datetime) -> datetime | None:
        step = timedelta(seconds=self.seconds)
        return self.anchor + ((after - self.anchor) // step + 1) * step

    def latest_slot(self, until: datetime) -> datetime:
        step = timedelta(seconds=self.seconds)
        return self.anchor + ((until - self.anchor) // step) * step


# --- a schedule's timing: slots, misfires and overlaps --------------------------------------


MIN_GRACE = 2.0
MAX_SECONDS = 366 * 86400


def _within(what: str, value: float, low: float, high: float) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        raise InvalidSchedule(f"{what} must be {low:g} to {high:.0f} seconds, got {value:g}")


@dataclass(frozen=True)
class Tick:
    """What one beat pass decides for one schedule."""

    fire: tuple[datetime, ...]  # slots to trigger now, oldest first
    decided_until: datetime  # every slot up to here is decided (fired, dropped or buffered)
    buffered: datetime | None  # buffer_one: the slot waiting for the running run to finish
    missed: tuple[datetime, datetime] | None = None  # (after, until): slots there were missed
    overlapping: tuple[datetime, ...] = ()  # slots dropped by the overlap policy
    changed: bool = False  # False: nothing was due; the schedule's row need not be written


@dataclass(frozen=True)
class Timing:
    trigger: Cron | int  # a cron expression, or an interval in seconds
    tz: str = "UTC"
    misfire: Misfire = Misfire.SKIP
    overlap: Overlap = Overlap.ALLOW
    grace: float = 10.0
    catch_up_window: float = 86400.0
    start_at: datetime | None = None
    end_at: datetime | None = None

    def __post_init__(self) -> None:
        zone(self.tz)
        if isinstance(self.trigger, int):
            _within("an interval", self.trigger, 1, MAX_SECONDS)
        # Under ~2 s a healthy beat's own delay would count as a misfire.
        _within("the misfire grace", self.grace, MIN_GRACE, 86400)
        _within("the catch-up window", self.catch_up_window, 1, MAX_SECONDS)
        for moment in (self.start_at, self.end_at):
            if moment is not None and moment.tzinfo is None:
                raise InvalidSchedule(f"start and end need a time zone, got {moment.isoformat()}")
        if self.start_at and self.end_at and self.start_at >= self.end_at:
            raise InvalidSchedule("the schedule's end must come after its start")

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
        if self.start_at is not None and after < self.start_at:
            after = self.start_at - timedelta(microseconds=1)
        slot = self.source.next_slot(after)
        if slot is None or (self.end_at is not None and slot > self.end_at):
            return None
        return slot

    def slots(self, after: datetime, until: datetime, limit: int) -> list[datetime]:
        """Up to ``limit`` slots in (after, until], oldest first."""
        found: list[datetime] = []
        slot = self.next_slot(after)
        while slot is not None and slot <= until and len(found) < limit:
            found.append(slot)
            slot = self.next_slot(slot)
        return found

    def latest_slot(self, after: datetime, until: datetime) -> datetime | None:
        """The last slot in (after, until], without walking every slot from ``after``."""
        source = self.source
        if isinstance(source, Every):
            if self.end_at is not None:
                until = min(until, self.end_at)
            slot = source.latest_slot(until)
            starts = self.start_at or after
            return slot if slot > after and slot >= starts else None
        reach = timedelta(hours=1)
        while True:
            low = max(after, until - reach)
            found = self.slots(low, until, limit=10**6)
            if found or low == after:
                return found[-1] if found else None
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

    def upcoming(self, after: datetime, count: int) -> Iterator[datetime]:
        slot = self.next_slot(after)
        for _ in range(count):
            if slot is None:
                return
            yield slot
            slot = self.next_slot(slot)


def make_timing(
    *,
    cron: str | None = None,
    every: int | None = None,
    tz: str = "UTC",
    misfire: str = Misfire.SKIP.value,
    overlap: str = Overlap.ALLOW.value,
    grace: float = 10.0,
    catch_up_window: float = 86400.0,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
    now: datetime | None = None,
) -> Timing:
    """Check a schedule's definition as a user wrote it; raise InvalidSchedule naming the fault."""
    if (cron is None) == (every is None):
        raise InvalidSchedule("a schedule needs exactly one of a cron expression or an interval")
    trigger: Cron | int = Cron.parse(cron) if cron is not None else int(every or 0)
    timing = Timing(
        trigger=trigger,
        tz=tz,
        misfire=policy(Misfire, misfire),
        overlap=policy(Overlap, overlap),
        grace=grace,
        catch_up_window=catch_up_window,
        start_at=start_at,
        end_at=end_at,
    )
    try:
        upcoming = timing.next_slot(now or datetime.now(UTC))
    except OverflowError:
        upcoming = None
    if upcoming is None:
        bounded = " within its start and end" if start_at or end_at else ""
        raise InvalidSchedule(f"schedule {timing.describe()} never fires{bounded}")
    return timing


_SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")


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

    def __post_init__(self) -> None:
        if not _SCHEDULE_NAME.match(self.name):
            raise InvalidSchedule(
                f"schedule name {self.name!r} must be 1-100 letters, digits or _ . -"
            )

    def same_definition(self, other: Schedule) -> bool:
        return (self.name, self.template, self.variables, self.timing) == (
            other.name,
            other.template,
            other.variables,
            other.timing,
        )

    def as_json(self, now: datetime) -> dict[str, Any]:
        timing = self.timing
        return {
            "name": self.name,
            "template": self.template,
            "variables": self.variables,
            "cron": timing.cron,
            "every": timing.every,
            "tz": timing.tz,
            "misfire": timing.misfire.value,
            "overlap": timing.overlap.value,
            "grace": timing.grace,
            "catch_up_window": timing.catch_up_window,
            "start": _iso_or_none(timing.start_at),
            "end": _iso_or_none(timing.end_at),
            "enabled": self.enabled,
            "next_slots": [iso(s) for s in timing.upcoming(now, 3)] if self.enabled else [],
            "buffered": _iso_or_none(self.buffered),
            "last_run_id": self.last_run_id,
            "last_error": self.last_error,
        }


def _iso_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else iso(moment)
