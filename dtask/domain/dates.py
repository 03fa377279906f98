"""``DateRangeSplit``: a range of dates or datetimes cut into children by calendar steps (one
child per day, per week of 7 days, per month...). Pure.

Dates are inclusive at both ends, as a person says "March 1 to March 31": each child gets
``{a: first_day, b: last_day}``. Datetimes are half-open, as time ranges are queried: each child
gets ``[a, b)`` and the next one starts at this one's ``b``. Day, week and month steps follow
the wall clock of the split's time zone (a day is 23 or 25 hours across a DST change); second,
minute and hour steps are absolute. Each boundary is computed from the start (``start + k``
steps), so month steps keep their day: from January 31, the 28th (or 29th) of February, then
March 31.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dtask.domain.splitting import ChildSpec
from dtask.exceptions import InvalidSplit, InvalidVariables

_STEP = re.compile(r"^\s*(\d+)\s*(s|min|h|d|w|mo)\s*$")
_ABSOLUTE = {"s": 1, "min": 60, "h": 3600}  # seconds of a unit that is not on the calendar
_LONGEST_DAY = 25 * 3600  # seconds (a day that ends summer time)
_COUNTED = 1_000_000  # children counted one by one at most; more are refused as more


@dataclass(frozen=True)
class DateRangeSplit:
    """Split ``[rendered[start], rendered[end]]`` into children of ``chunk`` steps each:
    ``step`` is a number and a unit (``s``, ``min``, ``h``, ``d``, ``w``, ``mo``), ``tz`` the
    time zone whose calendar day, week and month steps follow (default: the start's own UTC
    offset). ``carry`` names skeleton keys copied into every spec."""

    start: str
    end: str
    step: str = "1d"
    chunk: int = 1
    a: str = "start"
    b: str = "end"
    tz: str | None = None
    carry: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.unit  # noqa: B018  (refused at definition, in one line)
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise InvalidSplit(
                f"DateRangeSplit chunk must be a whole number >= 1, got {self.chunk!r}"
            )
        if self.tz is not None:
            try:
                ZoneInfo(self.tz)
            except (ZoneInfoNotFoundError, ValueError):
                raise InvalidSplit(
                    f"DateRangeSplit tz {self.tz!r} is not a known time zone"
                ) from None

    @property
    def unit(self) -> tuple[int, str]:
        found = _STEP.match(self.step) if isinstance(self.step, str) else None
        if found is None or int(found[1]) < 1:
            raise InvalidSplit(
                f"DateRangeSplit step must be a number >= 1 and a unit (s, min, h, d, w, mo),"
                f" like '1d' or '15min', got {self.step!r}"
            )
        return int(found[1]), found[2]

    def bounds(self, rendered: Any) -> tuple[date, date]:
        if not isinstance(rendered, Mapping):
            raise InvalidSplit("DateRangeSplit needs a skeleton that is a dict")
        values = [_moment(rendered, key) for key in (self.start, self.end)]
        lo, hi = values
        if isinstance(lo, datetime) != isinstance(hi, datetime):
            raise InvalidVariables(
                f"{self.start} and {self.end} must both be dates or both datetimes, got"
                f" {lo.isoformat()} and {hi.isoformat()}"
            )
        if not isinstance(lo, datetime) and self.unit[1] in _ABSOLUTE:
            raise InvalidSplit(
                f"a range of dates steps in days, weeks or months, not {self.step!r}"
            )
        if hi < lo or (isinstance(lo, datetime) and hi == lo):
            raise InvalidVariables(
                f"the range {self.start}={lo.isoformat()} .. {self.end}={hi.isoformat()} is"
                f" empty ({self.end} must be after {self.start})"
            )
        return lo, hi

    def _boundaries(self, lo: date, hi: date) -> Iterator[date]:
        """Each child's first instant (a date, or an aware datetime), then the end's (the day
        after the last for dates: half-open inside)."""
        n, unit = self.unit
        n *= self.chunk
        if not isinstance(lo, datetime):
            first, last = lo, hi + timedelta(days=1)
            at: Any = lambda k: _calendar(lo, k * n, unit)  # noqa: E731
        else:
            assert isinstance(hi, datetime)  # bounds() gave two of a kind
            zone: tzinfo = ZoneInfo(self.tz) if self.tz else lo.tzinfo  # type: ignore[assignment]
            first, last = lo.astimezone(zone), hi.astimezone(zone)  # first: its fold kept
            wall = first.replace(tzinfo=None)
            if unit in _ABSOLUTE:
                step = timedelta(seconds=n * _ABSOLUTE[unit])
                at = lambda k: (lo + k * step).astimezone(zone)  # noqa: E731
            else:
                at = lambda k: _calendar(wall, k * n, unit).replace(tzinfo=zone)  # noqa: E731
        yield first
        k = 1
        while (point := at(k)) < last:
            yield point
            k += 1
        yield last

    def count(self, rendered: Any) -> int:
        """How many children: counted, unless even the fewest the range could make (every
        step at its longest: a 25-hour day, a 31-day month) is past any limit."""
        lo, hi = self.bounds(rendered)
        n, unit = self.unit
        longest = _ABSOLUTE.get(unit) or _LONGEST_DAY * {"d": 1, "w": 7, "mo": 31}[unit]
        span = (hi - lo).total_seconds() if isinstance(lo, datetime) else (hi - lo).days * 86_400
        fewest = int(span // (n * self.chunk * longest))
        if fewest > _COUNTED:
            return fewest
        return sum(1 for _ in self._boundaries(lo, hi)) - 1

    def __call__(self, rendered: Any) -> list[ChildSpec]:
        return list(self.iterate(rendered))

    def iterate(self, rendered: Any) -> Iterator[ChildSpec]:
        lo, hi = self.bounds(rendered)
        missing = [k for k in self.carry if k not in rendered]
        if missing:
            raise InvalidSplit(f"DateRangeSplit: the skeleton has no key {missing[0]!r} to carry")
        extra = {k: rendered[k] for k in self.carry}
        points = self._boundaries(lo, hi)
        first = next(points)
        for after in points:
            last = after if isinstance(first, datetime) else after - timedelta(days=1)
            yield {self.a: first.isoformat(), self.b: last.isoformat(), **extra}
            first = after


def _moment(rendered: Mapping[str, Any], key: str) -> date:
    if key not in rendered:
        raise InvalidSplit(f"DateRangeSplit: the skeleton has no key {key!r}")
    value = rendered[key]
    try:
        if isinstance(value, str):
            value = datetime.fromisoformat(value) if "T" in value else date.fromisoformat(value)
        if not isinstance(value, date):
            raise ValueError(value)
    except ValueError:
        raise InvalidVariables(
            f"range {key} must be an ISO 8601 date or datetime, got {value!r:.80}"
        ) from None
    if isinstance(value, datetime) and value.utcoffset() is None:
        raise InvalidVariables(f"range {key} must name its time zone, got {value.isoformat()!r}")
    return value


def _calendar(start: Any, steps: int, unit: str) -> Any:
    """``start`` (a date, or a naive wall-clock datetime) plus ``steps`` calendar units."""
    if unit == "d":
        return start + timedelta(days=steps)
    if unit == "w":
        return start + timedelta(weeks=steps)
    months = start.month - 1 + steps
    year, month = start.year + months // 12, months % 12 + 1
    last_day = (date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)).day
    return start.replace(year=year, month=month, day=min(start.day, last_day))
