"""Cron and interval slots, DST, and the misfire/overlap rules (pure, parameter tables)."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from dtask.domain.cron import Cron
from dtask.domain.schedules import (
    Misfire,
    Overlap,
    Schedule,
    Timing,
    iso,
    make_timing,
    trigger_key,
)
from dtask.exceptions import InvalidSchedule


def local(text: str, tz: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(tz))


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def upcoming(expr: str, tz: str, after: str, count: int) -> list[str]:
    """The next slots as local wall times with their UTC offset, e.g. '03-29 03:30+0200'."""
    timing = Timing(Cron.parse(expr), tz)
    return [
        s.astimezone(ZoneInfo(tz)).strftime("%m-%d %H:%M:%S%z")
        for s in timing.upcoming(local(after, tz), count)
    ]


@pytest.mark.parametrize(
    ("expr", "tz", "after", "expected"),
    [
        ("*/15 * * * *", "UTC", "2026-01-01T10:07",
         ["01-01 10:15:00+0000", "01-01 10:30:00+0000", "01-01 10:45:00+0000"]),
        ("0 9 * * mon-fri", "UTC", "2026-11-20T10:00",  # Friday after 9: next is Monday
         ["11-23 09:00:00+0000", "11-24 09:00:00+0000", "11-25 09:00:00+0000"]),
        ("0 0 1,15 * mon", "UTC", "2026-11-20T00:00",  # both day fields: either matches
         ["11-23 00:00:00+0000", "11-30 00:00:00+0000", "12-01 00:00:00+0000"]),
        ("0 0 */2 * mon", "UTC", "2026-11-20T00:00",  # a leading * is unrestricted (Vixie):
         ["11-23 00:00:00+0000", "12-07 00:00:00+0000"]),  # odd days that are Mondays
        ("0 0 29 2 *", "UTC", "2026-01-01T00:00", ["02-29 00:00:00+0000"]),  # 2028
        ("*/20 * * * * *", "UTC", "2026-01-01T00:00:50",  # six fields: seconds first
         ["01-01 00:01:00+0000", "01-01 00:01:20+0000", "01-01 00:01:40+0000"]),
        ("@daily", "Asia/Kolkata", "2026-01-01T12:00",
         ["01-02 00:00:00+0530", "01-03 00:00:00+0530"]),
        ("0 12 * jan,jul 0", "UTC", "2026-06-01T00:00",  # 0 is Sunday
         ["07-05 12:00:00+0000", "07-12 12:00:00+0000"]),
        ("0 12 * * 7", "UTC", "2026-07-01T00:00", ["07-05 12:00:00+0000"]),  # so is 7
        ("0 18 L * *", "UTC", "2028-01-15T00:00",  # L: the month's last day (2028 is leap)
         ["01-31 18:00:00+0000", "02-29 18:00:00+0000", "03-31 18:00:00+0000"]),
        ("0 18 LW * *", "UTC", "2026-01-15T00:00",  # LW: its last weekday (Jan 31 is a Sat)
         ["01-30 18:00:00+0000", "02-27 18:00:00+0000", "03-31 18:00:00+0000"]),
        ("0 9 * * 5L", "UTC", "2026-01-01T00:00",  # 5L: its last Friday
         ["01-30 09:00:00+0000", "02-27 09:00:00+0000"]),
        ("0 9 * * mon#2", "UTC", "2026-01-01T00:00",  # #2: its second Monday
         ["01-12 09:00:00+0000", "02-09 09:00:00+0000"]),
        ("0 0 1 * sun#1", "UTC", "2026-01-02T00:00",  # both day fields restricted: either
         ["01-04 00:00:00+0000", "02-01 00:00:00+0000", "03-01 00:00:00+0000"]),
        ("30 15 10 * * *", "Europe/Berlin", "2026-01-01T10:15:31",  # six fields: 10:15:30
         ["01-02 10:15:30+0100", "01-03 10:15:30+0100"]),
        ("@hourly", "UTC", "2026-01-01T10:00", ["01-01 11:00:00+0000"]),
    ],
)  # fmt: skip
def test_cron_slots(expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, tz, after, len(expected)) == expected


@pytest.mark.parametrize(
    ("case", "expr", "tz", "after", "expected"),
    [
        # Spring forward: 02:00-03:00 does not exist. A fixed-hour slot fires at the first
        # minute after the gap (Debian cron); a job for every hour follows real time and has
        # no 02:xx that day, and so does any six-field expression.
        ("berlin spring, fixed hour", "30 2 * * *", "Europe/Berlin", "2026-03-28T12:00",
         ["03-29 03:00:00+0200", "03-30 02:30:00+0200"]),
        ("berlin spring, two in the gap", "15,45 2 * * *", "Europe/Berlin", "2026-03-28T12:00",
         ["03-29 03:00:00+0200", "03-30 02:15:00+0200"]),  # both move to 03:00: run once
        ("berlin spring, six fields", "0 30 2 * * *", "Europe/Berlin", "2026-03-28T12:00",
         ["03-30 02:30:00+0200"]),
        ("berlin spring, every hour", "*/30 * * * *", "Europe/Berlin", "2026-03-29T01:00",
         ["03-29 01:30:00+0100", "03-29 03:00:00+0200", "03-29 03:30:00+0200"]),
        ("berlin spring, minute *", "* 2 * * *", "Europe/Berlin", "2026-03-29T00:00",
         ["03-30 02:00:00+0200", "03-30 02:01:00+0200"]),  # wildcard: nothing in the gap
        ("berlin spring, hours 2 and 3", "0 2,3 * * *", "Europe/Berlin", "2026-03-29T00:00",
         ["03-29 03:00:00+0200", "03-30 02:00:00+0200"]),  # 02:00 -> 03:00 = 03:00: once
        # Fall back: 02:00-03:00 happens twice. Fixed hour: once, at the first pass;
        # every hour: both passes.
        ("berlin fall, fixed hour", "30 2 * * *", "Europe/Berlin", "2026-10-24T12:00",
         ["10-25 02:30:00+0200", "10-26 02:30:00+0100"]),
        ("berlin fall, every hour", "*/30 * * * *", "Europe/Berlin", "2026-10-25T01:45",
         ["10-25 02:00:00+0200", "10-25 02:30:00+0200", "10-25 02:00:00+0100",
          "10-25 02:30:00+0100", "10-25 03:00:00+0100"]),
        ("berlin fall, six fields", "0 30 2 * * *", "Europe/Berlin", "2026-10-24T12:00",
         ["10-25 02:30:00+0200", "10-25 02:30:00+0100", "10-26 02:30:00+0100"]),
        ("new york spring, fixed hour", "0 2 * * *", "America/New_York", "2026-03-07T12:00",
         ["03-08 03:00:00-0400", "03-09 02:00:00-0400"]),
        ("lord howe spring, 30 min", "45 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00",
         ["10-04 02:45:00+1100", "10-05 02:45:00+1100"]),  # 02:00-02:30 is skipped, not 02:45
        ("lord howe spring, in the gap", "15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00",
         ["10-04 02:30:00+1100", "10-05 02:15:00+1100"]),
        ("new york spring, every hour", "15 * * * *", "America/New_York", "2026-03-08T00:30",
         ["03-08 01:15:00-0500", "03-08 03:15:00-0400"]),
        ("new york fall, fixed hour", "30 1 * * *", "America/New_York", "2026-10-31T12:00",
         ["11-01 01:30:00-0400", "11-02 01:30:00-0500"]),
        ("new york fall, every hour", "30 * * * *", "America/New_York", "2026-11-01T00:45",
         ["11-01 01:30:00-0400", "11-01 01:30:00-0500", "11-01 02:30:00-0500"]),
    ],
)  # fmt: skip
def test_cron_across_dst(case: str, expr: str, tz: str, after: str, expected: list[str]) -> None:
    assert upcoming(expr, tz, after, len(expected)) == expected, case


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("56 */3 * * *", ["04-05 03:56:00+1245", "04-05 06:56:00+1245"]),
        ("0 56 3 * * *", ["04-05 03:56:00+1245", "04-06 03:56:00+1245"]),
        ("* 0,56 3 * * *", ["04-05 03:56:00+1245", "04-05 03:56:01+1245"]),  # no 03:00:xx
    ],
)
def test_cron_goes_on_where_cronsim_loops_for_ever(expr: str, expected: list[str]) -> None:
    # Chatham falls back from 03:45 to 02:45. cronsim's real-time walk from the first pass
    # jumps from 02:56 (second pass) back to 03:00 (first pass) for ever; dtask resumes
    # further on, so the second pass's 03:00:xx (a real-time match) is missed.
    assert upcoming(expr, "Pacific/Chatham", "2020-04-05T03:06:33", len(expected)) == expected


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        # From inside the first pass of the repeated hour: the second pass is still to come.
        ("*/15 * * * *", "2026-10-25T00:10:00", "2026-10-25T00:15:00"),  # 02:15 CEST
        ("*/15 * * * *", "2026-10-25T00:50:00", "2026-10-25T01:00:00"),  # 02:00 CET
        # A fixed time fires in the first pass only: from inside the second pass (02:10 CET)
        # cronsim yields 02:15 CEST again, which is in the past; the next slot is a day on.
        ("15 2 * * *", "2026-10-25T00:10:00", "2026-10-25T00:15:00"),  # 02:15 CEST
        ("15 2 * * *", "2026-10-25T01:10:00", "2026-10-26T01:15:00"),  # 02:15 CET, Monday
        # Spring: 02:15 does not exist and fires at 03:00 CEST.
        ("15 2 * * *", "2026-03-29T00:50:00", "2026-03-29T01:00:00"),
        ("*/15 * * * *", "2026-03-29T00:50:00", "2026-03-29T01:00:00"),
    ],
)
def test_cron_next_slot_from_inside_a_dst_change(expr: str, after: str, expected: str) -> None:
    assert Timing(Cron.parse(expr), "Europe/Berlin").next_slot(utc(after)) == utc(expected)


def test_slots_are_strictly_increasing_over_a_year_of_dst_changes() -> None:
    for tz in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        timing = Timing(Cron.parse("*/30 * * * *"), tz)
        slots = list(timing.upcoming(utc("2026-01-01T00:00:00"), 2 * 24 * 366))
        assert all(a < b for a, b in itertools.pairwise(slots)), tz
        fixed = Timing(Cron.parse("30 2 * * *"), tz)
        days = list(fixed.upcoming(utc("2026-01-01T00:00:00"), 365))
        assert len({d.astimezone(ZoneInfo(tz)).date() for d in days}) == 365, tz


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("* * *", "cron '* * *': needs 5 fields, has 3 (fields: minute hour"),
        ("61 * * * *", "cron '61 * * * *': bad minute field"),
        ("* 24 * * *", "bad hour field"),
        ("*/0 * * * *", "bad minute field"),
        ("5-1 * * * *", "bad minute field"),
        ("* * * foo *", "bad month field"),
        ("* * 0 * *", "bad day-of-month field"),
        ("* * 15W * *", "bad day-of-month field"),  # only LW, the month's last weekday
        ("* * * * 8", "bad day-of-week field"),
        ("* * * * mon#6", "bad day-of-week field"),
        ("60 * * * * *", "bad second field"),
        ("1,,2 * * * *", "bad minute field"),
        ("@fortnightly", "unknown macro"),
    ],
)
def test_bad_cron_says_which_field(expr: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=re.escape(message)) as caught:
        Cron.parse(expr)
    assert "\n" not in str(caught.value)


def test_a_bad_cron_field_reads_as_one_actionable_line() -> None:
    with pytest.raises(InvalidSchedule) as caught:
        Cron.parse(" 61 * * * * ")
    assert str(caught.value) == (
        "cron '61 * * * *': bad minute field"
        " (fields: minute hour day-of-month month day-of-week, or 6 with seconds first)"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of"),
        ({"cron": "* * * * *", "misfre": "catch_up"}, "unknown schedule option.s. misfre"),
        ({"every": 5, "start_at": utc("2027-01-01T00:00")}, "option.s. start_at .known: "),
        ({"cron": "* * * * *", "every": 5}, "exactly one of"),
        ({"every": 0}, "an interval must be 1 to 31622400 seconds, got 0"),
        ({"every": 10**10}, "an interval must be 1 to"),
        ({"cron": "0 0 30 2 *"}, "cron '0 0 30 2 \\*' never fires: no month in its month"),
        ({"every": 5, "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": 5, "misfire": "later"}, "misfire policy must be one of skip, run_once"),
        ({"every": 5, "overlap": "queue"}, "overlap policy must be one of allow, skip"),
        ({"every": 5, "grace": 1}, "the misfire grace must be 2 to 86400 seconds, got 1"),
        ({"every": 5, "grace": float("nan")}, "grace must be 2 to 86400 seconds, got nan"),
        ({"every": 5, "catch_up_window": float("inf")}, "window must be 1 to"),
        ({"every": 5, "catch_up_window": 0}, "window must be 1 to"),
        ({"cron": "0 0 1 1 *", "start": datetime(9999, 6, 1, tzinfo=UTC)},
         "start and end must lie between 1970 and 8999"),  # slot arithmetic would overflow
        ({"every": 5, "end": datetime(9999, 12, 31, 23, 59, tzinfo=UTC)},
         "start and end must lie between 1970 and 8999, got 9999-12-31T23:59:00"),
        ({"every": 5, "tz": "A" * 300}, "unknown time zone 'AAAA"),
        ({"every": 5, "tz": "Europe/\x00"}, "unknown time zone"),
        ({"cron": "* " * 150}, "a cron expression is at most 200 characters, got 300"),
        ({"cron": "0 0 1 1 *", "start": utc("2027-01-02T00:00"),
          "end": utc("2027-12-31T00:00")}, "never fires within its start and end"),
        ({"every": 5, "start": utc("2027-01-01T00:00"), "end": utc("2026-01-01T00:00")},
         "end must come after its start"),
        ({"every": 5, "end": utc("2020-01-01T00:00")}, "never fires"),
        ({"every": 5, "start": datetime(2027, 1, 1)}, "need a time zone"),
    ],
)  # fmt: skip
def test_bad_definitions(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        make_timing(now=utc("2026-06-01T00:00"), **kwargs)  # type: ignore[arg-type]


def test_schedule_names_fit_in_a_trigger_key() -> None:
    with pytest.raises(InvalidSchedule, match="letters, digits"):
        Schedule("a:b", "t", {}, Timing(5))
    assert trigger_key("nightly", utc("2026-11-22T12:00:00")) == (
        "schedule:nightly:2026-11-22T12:00:00Z"
    )
    assert iso(local("2026-11-22T13:00:00.5", "Europe/Berlin")) == "2026-11-22T12:00:00.500000Z"


def test_intervals_count_real_time_from_their_start() -> None:
    every = Timing(7, start_at=utc("2026-01-01T00:00:00"))
    assert every.slots(utc("2025-12-31T00:00:00"), utc("2026-01-01T00:00:15"), 10) == [
        utc("2026-01-01T00:00:00"),
        utc("2026-01-01T00:00:07"),
        utc("2026-01-01T00:00:14"),
    ]
    bounded = Timing(60, end_at=utc("2026-01-01T00:02:00"))
    assert bounded.slots(utc("2026-01-01T00:00:00"), utc("2026-01-02T00:00:00"), 10) == [
        utc("2026-01-01T00:01:00"),
        utc("2026-01-01T00:02:00"),
    ]


# --- one beat pass: misfire and overlap -----------------------------------------------------

T0 = utc("2026-01-01T00:00:00")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def secs(slots: tuple[datetime, ...]) -> list[float]:
    return [(s - T0).total_seconds() for s in slots]


@pytest.mark.parametrize(
    ("misfire", "decided", "now", "fire"),
    [
        # A healthy beat: every slot on time, whatever the policy.
        (Misfire.SKIP, 0, 1.2, [1]),
        (Misfire.SKIP, 0, 3.5, [1, 2, 3]),  # all within the 10 s grace
        # No beat from 0 to 30: slots 1..20 are over 10 s late (missed), 21..30 on time.
        (Misfire.SKIP, 0, 30, list(range(21, 31))),
        (Misfire.RUN_ONCE, 0, 30, [20, *range(21, 31)]),
        (Misfire.CATCH_UP, 0, 30, list(range(1, 31))),
    ],
)
def test_misfire_policies(misfire: Misfire, decided: float, now: float, fire: list[int]) -> None:
    timing = Timing(1, misfire=misfire, grace=10, start_at=T0)
    tick = timing.plan(at(decided), at(now), None, previous_running=False)
    assert secs(tick.fire) == fire
    assert tick.decided_until == at(now)


def test_catch_up_is_bounded_by_its_window_and_per_pass_limit() -> None:
    timing = Timing(1, misfire=Misfire.CATCH_UP, grace=2, catch_up_window=60, start_at=T0)
    tick = timing.plan(at(0), at(1000), None, previous_running=False)
    assert secs(tick.fire) == list(range(941, 1001))  # only the last 60 s are caught up
    limited = timing.plan(at(0), at(1000), None, previous_running=False, limit=5)
    assert secs(limited.fire) == [941, 942, 943, 944, 945]
    assert limited.decided_until == at(945)  # the next pass goes on from there


def test_a_pass_that_finds_no_missed_slot_reports_none() -> None:
    timing = Timing(60, grace=2, start_at=T0)
    quiet = timing.plan(at(1), at(30), None, False)
    assert quiet.missed is None and not quiet.changed  # nothing due: no row to write
    assert timing.plan(at(1), at(90), None, False).missed == (at(1), at(88))


def test_a_pass_never_moves_decided_until_backwards() -> None:
    # Another beat (or a resume) decided up to 5 s after this pass's clock.
    tick = Timing(1, start_at=T0).plan(at(5), at(2), None, False)
    assert tick.decided_until == at(5) and tick.fire == () and not tick.changed


@pytest.mark.parametrize(
    ("overlap", "running", "buffered", "slots_due", "fire", "buffered_after", "dropped"),
    [
        (Overlap.ALLOW, True, None, [1, 2], [1, 2], None, []),
        (Overlap.SKIP, True, None, [1, 2], [], None, [1, 2]),
        # Slots due together (after a misfire): one run at a time, so only the newest counts.
        (Overlap.SKIP, False, None, [1, 2], [2], None, [1]),
        (Overlap.BUFFER_ONE, True, None, [1, 2], [], 2, [1]),
        (Overlap.BUFFER_ONE, True, 1, [2], [], 1, [2]),
        (Overlap.BUFFER_ONE, False, 1, [2], [1], 2, []),  # buffered goes; the new one waits
        (Overlap.BUFFER_ONE, False, 1, [], [1], None, []),
    ],
)
def test_overlap_policies(
    overlap: Overlap,
    running: bool,
    buffered: int | None,
    slots_due: list[int],
    fire: list[int],
    buffered_after: int | None,
    dropped: list[int],
) -> None:
    timing = Timing(1, overlap=overlap, grace=100, start_at=T0)
    decided = at(slots_due[0] - 0.5) if slots_due else at(10)
    now = at(slots_due[-1] + 0.5) if slots_due else at(10.5)
    tick = timing.plan(decided, now, None if buffered is None else at(buffered), running)
    assert secs(tick.fire) == fire
    assert tick.buffered == (None if buffered_after is None else at(buffered_after))
    assert secs(tick.overlapping) == dropped


def test_run_once_with_overlap_skip_runs_the_on_time_slot_not_the_stale_one() -> None:
    timing = Timing(60, misfire=Misfire.RUN_ONCE, overlap=Overlap.SKIP, grace=10, start_at=T0)
    tick = timing.plan(at(0), at(185), None, previous_running=False)
    assert secs(tick.fire) == [180] and secs(tick.overlapping) == [120]


def test_run_once_finds_the_latest_missed_cron_slot_far_back() -> None:
    timing = Timing(Cron.parse("0 3 * * *"), "Europe/Berlin", misfire=Misfire.RUN_ONCE, grace=60)
    tick = timing.plan(utc("2026-01-01T00:00"), utc("2026-03-01T12:00"), None, False)
    assert tick.fire == (utc("2026-03-01T02:00"),)  # 03:00 CET


def test_latest_slot_is_the_walks_own_across_a_half_hour_dst_change() -> None:
    # Lord Howe falls back 30 minutes at 02:00 (15:00 UTC). cronsim's real-time walk from just
    # after the change skips 03:00-03:29 (+10:30) that day; one from 02:08 does not. The
    # latest slot must be the one the walk from `after` gives, not a shortcut's.
    timing = Timing(Cron.parse("* 3 * * *"), "Australia/Lord_Howe")
    after = utc("2020-04-04T15:00:00")
    assert timing.next_slot(after) == utc("2020-04-04T17:00:00")  # 03:30 +10:30
    assert timing.next_slot(utc("2020-04-04T15:38:00")) == utc("2020-04-04T16:30:00")
    assert timing.latest_slot(after, utc("2020-04-04T16:40:00")) is None
    assert timing.latest_slot(after, utc("2020-04-04T17:05:00")) == utc("2020-04-04T17:05:00")
