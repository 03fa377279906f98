"""Property tests: dtask's cron slots are exactly cronsim's, in any zone, across DST changes.

Where cronsim's walk loops for ever (a few real-time expressions right after Chatham's fall
back) there is nothing to compare with: there, only the slots before the loop must agree.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from dtask.domain.cron import MACROS, STEP_BUDGET, Cron
from dtask.domain.schedules import MAX_SECONDS, Timing
from dtask.exceptions import InvalidSchedule

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute DST shift
    "America/Santiago",  # DST changes at midnight
    "Asia/Kolkata",  # +05:30, no DST
    "Pacific/Chatham",  # +12:45 / +13:45
    "Europe/Dublin",  # "negative" DST in the tz database
    "Antarctica/Troll",  # a 2-hour DST shift
]
SLOTS = 8
YEARS = range(2020, 2036)
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


@st.composite
def cron_field(draw: st.DrawFn, low: int, high: int, names: list[str] | None = None) -> str:
    def value() -> str:
        v = draw(st.integers(low, high))
        if names and draw(st.booleans()):
            return names[(v - low) % len(names)]
        return str(v)

    def term() -> str:
        kind = draw(st.sampled_from(["value", "range", "step", "star-step", "range-step"]))
        if kind == "value":
            return value()
        step = str(draw(st.integers(1, high - low + 1)))
        if kind == "star-step":
            return f"*/{step}"
        if kind == "step":
            return f"{value()}/{step}"
        first = draw(st.integers(low, high))
        last = str(draw(st.integers(first, high)))
        return f"{first}-{last}/{step}" if kind == "range-step" else f"{first}-{last}"

    if draw(st.integers(0, 3)) == 0:
        return "*"
    return ",".join(term() for _ in range(draw(st.integers(1, 3))))


@st.composite
def day_of_month(draw: st.DrawFn) -> str:
    special = draw(st.sampled_from(["", "", "", "L", "LW", "L,15"]))
    return special or draw(cron_field(1, 31))


@st.composite
def day_of_week(draw: st.DrawFn) -> str:
    day = draw(st.sampled_from([*DAYS, *map(str, range(8))]))
    special = draw(st.sampled_from(["", "", "", f"{draw(st.integers(0, 7))}L", f"{day}#"]))
    if special.endswith("#"):
        return f"{special}{draw(st.integers(1, 5))}"
    return special or draw(cron_field(0, 7, DAYS))


@st.composite
def expressions(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(sorted(MACROS)))
    fields = [
        draw(cron_field(0, 59)),
        draw(cron_field(0, 23)),
        draw(day_of_month()),
        draw(cron_field(1, 12, MONTHS)),
        draw(day_of_week()),
    ]
    if draw(st.booleans()):
        fields.insert(0, draw(cron_field(0, 59)))
    return " ".join(fields)


def valid(expression: str) -> bool:
    try:
        Cron.parse(expression)
    except InvalidSchedule:
        return False
    return True


@cache
def transitions(zone: str) -> list[datetime]:
    """The instants in YEARS at which the zone's UTC offset changes (to the second)."""
    tz = ZoneInfo(zone)
    found = []
    day = datetime(YEARS[0], 1, 1, tzinfo=UTC)
    while day.year in YEARS:
        low, high = day, day + timedelta(days=1)
        if low.astimezone(tz).utcoffset() != high.astimezone(tz).utcoffset():
            while high - low > timedelta(seconds=1):
                mid = low + (high - low) / 2
                same = mid.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset()
                low, high = (mid, high) if same else (low, mid)
            found.append(high.replace(microsecond=0))
        day += timedelta(days=1)
    return found


@st.composite
def instants(draw: st.DrawFn, zone: str) -> datetime:
    """Any instant, or one within hours of one of the zone's DST changes."""
    changes = transitions(zone)
    if changes and draw(st.booleans()):
        near = st.one_of(st.integers(-900, 900), st.integers(-6 * 3600, 6 * 3600))
        return draw(st.sampled_from(changes)) + timedelta(seconds=draw(near))
    return draw(
        st.datetimes(datetime(YEARS[0], 1, 1), datetime(YEARS[-1], 12, 31), timezones=st.just(UTC))
    )


@st.composite
def cases(draw: st.DrawFn) -> tuple[Cron, str, datetime]:
    zone = draw(st.sampled_from(ZONES))
    expression = draw(expressions().filter(valid))
    return Cron.parse(expression), zone, draw(instants(zone))


class _Counted(CronSim):
    """cronsim, giving up as dtask does after STEP_BUDGET steps without a new slot."""

    steps = 0

    def tick(self, seconds: int = 1) -> None:
        self.steps += 1
        if self.steps > STEP_BUDGET:
            raise TimeoutError
        super().tick(seconds)


def library_slots(
    cron: Cron, zone: str, after: datetime, count: int
) -> tuple[list[datetime], bool]:
    """What ONE cronsim iterator yields from ``after``, in UTC, kept only where it advances;
    and whether it got stuck (looped without a new slot) before ``count`` slots."""
    found: list[datetime] = []
    latest = after
    walk = _Counted(cron.fields, after.astimezone(ZoneInfo(zone)))
    try:
        for fired in walk:
            if (slot := fired.astimezone(UTC)) > latest:
                found.append(slot)
                latest, walk.steps = slot, 0
            if len(found) == count:
                break
    except TimeoutError:
        return found, True
    return found, False


def chain(timing: Timing, after: datetime, count: int) -> list[datetime]:
    """Slots found one at a time, each search starting from the previous slot (as the beat)."""
    found: list[datetime] = []
    slot: datetime | None = after
    while len(found) < count and (slot := timing.next_slot(slot)) is not None:
        found.append(slot)
    return found


@settings(max_examples=500, deadline=None)
@given(cases())
def test_every_cron_slot_is_the_librarys_none_skipped_none_doubled(
    case: tuple[Cron, str, datetime],
) -> None:
    cron, zone, after = case
    expected, stuck = library_slots(cron, zone, after, SLOTS)
    timing = Timing(cron, zone)
    slots = chain(timing, after, SLOTS)
    walked = timing.slots(after, datetime.max.replace(tzinfo=UTC), SLOTS)
    if stuck:  # where cronsim loops for ever dtask goes on past it: the slots before agree
        slots, walked = slots[: len(expected)], walked[: len(expected)]
    assert slots == walked == expected
    assert all(slot.utcoffset() == timedelta(0) for slot in expected)


@settings(max_examples=400, deadline=None)
@given(cases())
def test_cron_slots_increase_strictly_from_after(case: tuple[Cron, str, datetime]) -> None:
    cron, zone, after = case
    slots = chain(Timing(cron, zone), after, SLOTS)
    assert all(a < b for a, b in itertools.pairwise([after, *slots]))


@settings(max_examples=300, deadline=None)
@given(cases(), st.floats(0, 1))
def test_latest_cron_slot_is_the_last_of_the_slots(
    case: tuple[Cron, str, datetime], fraction: float
) -> None:
    cron, zone, after = case
    timing = Timing(cron, zone)
    upcoming = chain(timing, after, SLOTS)
    if not upcoming:
        return
    until = after + (upcoming[-1] - after) * fraction
    slots = timing.slots(after, until, limit=SLOTS + 1)
    assert timing.latest_slot(after, until) == (slots[-1] if slots else None)


@settings(max_examples=400, deadline=None)
@given(
    seconds=st.one_of(st.integers(1, 120), st.integers(1, MAX_SECONDS)),
    anchor=st.datetimes(datetime(2000, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC)),
    offset=st.integers(-400 * 86400, 400 * 86400),
    span=st.integers(0, 50),
)
def test_interval_slots_are_anchored_multiples(
    seconds: int, anchor: datetime, offset: int, span: int
) -> None:
    timing = Timing(seconds, start_at=anchor)
    step = timedelta(seconds=seconds)
    after = anchor + timedelta(seconds=offset, microseconds=offset % 7)
    until = after + step * span
    slots = timing.slots(after, until, limit=100)
    assert all((slot - anchor) % step == timedelta(0) for slot in slots)
    assert all(slot >= anchor for slot in slots)
    assert all(b - a == step for a, b in itertools.pairwise(slots))
    assert chain(timing, after, len(slots)) == slots
    first = timing.next_slot(after)
    assert first is not None and first > after and first >= anchor
    assert first == anchor or first - step <= after  # the first slot after `after`: none skipped
    assert timing.latest_slot(after, until) == (slots[-1] if slots else None)
