"""Date and datetime parameters, and ``DateRangeSplit``: disjoint, covering, in order, counted
exactly, across DST changes and month ends (issue 42)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dtask.domain.dates import DateRangeSplit
from dtask.domain.params import Param
from dtask.domain.templates import Template
from dtask.exceptions import InvalidSplit, InvalidVariables, TemplateDefinitionError

ZONES = ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]


def _check_dates(split: DateRangeSplit, lo: date, hi: date) -> list[dict[str, Any]]:
    rendered = {"from": lo.isoformat(), "to": hi.isoformat()}
    specs = split(rendered)
    assert split.count(rendered) == len(specs)
    days = [(date.fromisoformat(s["start"]), date.fromisoformat(s["end"])) for s in specs]
    assert days[0][0] == lo and days[-1][1] == hi
    for (a, b), (after, _) in pairwise(days):
        assert a <= b and after == b + timedelta(days=1)  # disjoint and covering, in order
    return specs


@given(
    st.dates(date(1990, 1, 1), date(2060, 12, 31)),
    st.integers(0, 800),
    st.sampled_from(["1d", "2d", "1w", "1mo", "3mo"]),
    st.integers(1, 5),
)
def test_a_range_of_dates_is_cut_into_disjoint_covering_children(
    lo: date, days: int, step: str, chunk: int
) -> None:
    split = DateRangeSplit("from", "to", step=step, chunk=chunk)
    _check_dates(split, lo, lo + timedelta(days=days))


@settings(max_examples=200)
@given(
    st.datetimes(datetime(2020, 1, 1), datetime(2030, 12, 31)),
    st.integers(1, 90 * 24 * 60),
    st.sampled_from(["15min", "1h", "6h", "1d", "1w", "1mo"]),
    st.integers(1, 3),
    st.sampled_from(ZONES),
    st.booleans(),
    st.integers(0, 1),
)
@example(datetime(2027, 11, 7, 1, 0), 1, "15min", 1, "America/New_York", False, 0)  # fold-bound
def test_a_range_of_datetimes_is_cut_half_open_in_its_zone(
    start: datetime, minutes: int, step: str, chunk: int, zone: str, named: bool, fold: int
) -> None:
    tz = ZoneInfo(zone)
    lo = start.replace(tzinfo=tz, fold=fold)  # fold 1: the second 01:30 of a fall-back night
    hi = lo.astimezone(UTC) + timedelta(minutes=minutes)
    split = DateRangeSplit("from", "to", step=step, chunk=chunk, tz=zone if named else None)
    rendered = {"from": lo.isoformat(), "to": hi.isoformat()}
    specs = split(rendered)
    assert split.count(rendered) == len(specs)
    spans = [(datetime.fromisoformat(s["start"]), datetime.fromisoformat(s["end"])) for s in specs]
    # as instants: == between zones is False where an operand's offset hangs on its fold
    assert spans[0][0].timestamp() == lo.timestamp() and spans[-1][1] == hi
    for (a, b), (after, _) in pairwise(spans):
        assert a < b and after == b  # half-open: the next starts where this one ends


def test_day_steps_follow_the_wall_clock_across_a_dst_change() -> None:
    split = DateRangeSplit("from", "to", tz="Europe/Paris")
    specs = split({"from": "2026-03-28T00:00:00+01:00", "to": "2026-03-31T00:00:00+02:00"})
    assert specs == [
        {"start": "2026-03-28T00:00:00+01:00", "end": "2026-03-29T00:00:00+01:00"},
        {"start": "2026-03-29T00:00:00+01:00", "end": "2026-03-30T00:00:00+02:00"},  # 23 h
        {"start": "2026-03-30T00:00:00+02:00", "end": "2026-03-31T00:00:00+02:00"},
    ]


@pytest.mark.parametrize("step", ["1h", "1d"])
def test_a_start_in_the_repeated_hour_of_a_fall_back_night_is_kept(step: str) -> None:
    second = datetime(2026, 11, 1, 1, 30, tzinfo=ZoneInfo("America/New_York"), fold=1)
    assert second.isoformat() == "2026-11-01T01:30:00-05:00"
    rendered = {"from": second.isoformat(), "to": "2026-11-03T00:00:00-05:00"}
    specs = DateRangeSplit("from", "to", step=step, tz="America/New_York")(rendered)
    assert specs[0]["start"] == "2026-11-01T01:30:00-05:00"
    assert specs[1]["start"] == ("2026-11-01T02:30:00-05:00" if step == "1h" else
                                 "2026-11-02T01:30:00-05:00")  # fmt: skip


def test_month_steps_keep_their_day_and_a_month_of_days_makes_31_children() -> None:
    months = DateRangeSplit("from", "to", step="1mo")
    specs = months({"from": "2026-01-31", "to": "2026-05-15"})
    assert [(s["start"], s["end"]) for s in specs] == [
        ("2026-01-31", "2026-02-27"), ("2026-02-28", "2026-03-30"),
        ("2026-03-31", "2026-04-29"), ("2026-04-30", "2026-05-15"),
    ]  # fmt: skip
    daily = DateRangeSplit("day_from", "day_to", a="day", b="day_to", carry=("table",))
    march = daily({"day_from": "2026-03-01", "day_to": "2026-03-31", "table": "sales"})
    assert len(march) == 31 and march[0] == {"day": "2026-03-01", "day_to": "2026-03-01",
                                             "table": "sales"}  # fmt: skip


@pytest.mark.parametrize(
    ("rendered", "error", "says"),
    [
        ({"from": "2026-03-31", "to": "2026-03-01"}, InvalidVariables, "is empty (to must be"),
        ({"from": "2026-03-01", "to": "2026-03-01T00:00:00Z"}, InvalidVariables, "both be dates"),
        ({"from": "2026-03-01T00:00:00", "to": "2026-03-02T00:00:00Z"}, InvalidVariables,
         "must name its time zone"),
        ({"from": "March 1", "to": "2026-03-02"}, InvalidVariables, "ISO 8601 date or datetime"),
        ({"to": "2026-03-02"}, InvalidSplit, "the skeleton has no key 'from'"),
    ],
)  # fmt: skip
def test_bad_bounds_are_one_clear_error(rendered: dict[str, Any], error: type, says: str) -> None:
    with pytest.raises(error, match=None) as raised:
        DateRangeSplit("from", "to")(rendered)
    assert says in str(raised.value)


def test_bad_definitions_are_refused_at_once() -> None:
    for kwargs, says in (
        ({"step": "1m"}, "a unit (s, min, h, d, w, mo)"),
        ({"step": "0d"}, "a number >= 1"),
        ({"chunk": 0}, "chunk must be a whole number >= 1"),
        ({"tz": "Mars/Olympus"}, "not a known time zone"),
    ):
        with pytest.raises(InvalidSplit) as raised:
            DateRangeSplit("from", "to", **kwargs)
        assert says in str(raised.value)
    with pytest.raises(InvalidSplit, match="a range of dates steps in days"):
        DateRangeSplit("from", "to", step="1h")({"from": "2026-03-01", "to": "2026-03-02"})


def test_a_huge_range_is_counted_without_walking_it() -> None:
    split = DateRangeSplit("from", "to", step="1s")
    assert split.count({"from": "2000-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}) > 8e8


def test_date_and_datetime_parameters_are_checked_at_submit_and_kept_as_iso_text() -> None:
    day = Param(date, min="2020-01-01")
    assert day.check("day", date(2026, 3, 1)) == "2026-03-01"
    assert day.parse("day", " 2026-03-01 ") == "2026-03-01"
    for bad, says in (
        ("2026-02-30", "must be an ISO 8601 date like 2026-03-01, got '2026-02-30'"),
        (datetime(2026, 3, 1, tzinfo=UTC), "must be an ISO 8601 date"),
        ("2019-12-31", "must be >= 2020-01-01, got 2019-12-31"),
    ):
        with pytest.raises(InvalidVariables) as raised:
            day.check("day", bad)
        assert says in str(raised.value)
    moment = Param(datetime)
    assert moment.check("at", "2026-03-01T09:00:00Z") == "2026-03-01T09:00:00+00:00"
    with pytest.raises(InvalidVariables, match="must name its time zone"):
        moment.check("at", "2026-03-01T09:00:00")
    with pytest.raises(TemplateDefinitionError, match="a date's default must be an ISO 8601"):
        Param(date, default="tomorrow")


def test_a_template_over_a_month_of_days() -> None:
    per_day = Template(
        name="test_dates_month", params={"month_start": Param(date), "month_end": Param(date)},
        skeleton={"from": "${month_start}", "to": "${month_end}"},
        split=DateRangeSplit("from", "to", a="day", b="day"), function=lambda ctx, day: day,
    )  # fmt: skip
    _, total = per_day.count({"month_start": date(2026, 3, 1), "month_end": "2026-03-31"}, 100)
    assert total == 31
    with pytest.raises(InvalidVariables, match="'month_end' must be an ISO 8601 date"):
        per_day.count({"month_start": "2026-03-01", "month_end": "31/03/2026"}, 100)
