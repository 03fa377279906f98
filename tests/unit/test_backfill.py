"""A backfill's slots (dtask/domain/backfill.py): the schedule's own, both ends included, in
order, bounded; bad ranges refused in one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.backfill import MOST_SLOTS, backfill_slots
from dtask.domain.schedules import Schedule, make_timing
from dtask.exceptions import InvalidSchedule

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def schedule(**when: object) -> Schedule:
    return Schedule("s", "t", {}, make_timing(now=NOW, **when))  # type: ignore[arg-type]


def test_both_ends_are_included_in_the_schedules_zone() -> None:
    daily = schedule(cron="0 2 * * *", tz="Europe/Berlin")
    start = datetime(2026, 3, 28, 1, tzinfo=UTC)  # 02:00 Berlin (UTC+1)
    end = datetime(2026, 3, 30, 0, tzinfo=UTC)  # 02:00 Berlin (UTC+2, after the change)
    assert backfill_slots(daily, start, end) == [
        start, datetime(2026, 3, 29, 1, tzinfo=UTC), end  # 02:00 skipped: 03:00, as cron
    ]  # fmt: skip


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
       st.integers(min_value=0, max_value=5000))  # fmt: skip
def test_every_slot_in_range_once_in_order(start: datetime, minutes: int) -> None:
    every = schedule(every=3600)
    a = start.replace(tzinfo=UTC)
    b = a + timedelta(minutes=minutes)
    found = backfill_slots(every, a, b)
    assert found == sorted(set(found)) and all(a <= s <= b for s in found)
    assert len(found) in (minutes // 60, minutes // 60 + 1)
    assert all(s.timestamp() % 3600 == 0 for s in found)


def test_bad_ranges() -> None:
    daily = schedule(cron="0 2 * * *")
    with pytest.raises(InvalidSchedule, match="is before its --from"):
        backfill_slots(daily, NOW, NOW - timedelta(days=1))
    with pytest.raises(InvalidSchedule, match=f"holds over {MOST_SLOTS:,} slots"):
        backfill_slots(schedule(every=1), NOW, NOW + timedelta(days=1))
    with pytest.raises(InvalidSchedule, match="need a time zone"):
        backfill_slots(daily, NOW.replace(tzinfo=None), NOW)
    assert backfill_slots(daily, NOW, NOW + timedelta(hours=1)) == []
