"""A beat pass costs what is due, not how many schedules there are: it reads only the
schedules whose ``next_due_at`` has come, and decides them in chunks of their own
transactions, so a cold start over thousands of due schedules never holds one transaction
past the beat's limit (at 45,000 schedules every pass once failed so, and nothing fired)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db.schedules import Decide, Firing, ScheduleStore
from dtask.domain.schedules import Schedule, Timing


@pytest.fixture
def many(dtask_env: dict[str, str]) -> Iterator[tuple[ScheduleStore, str]]:
    """A prefix for this test's schedules, all removed afterwards."""
    store = services.store().schedules
    prefix = f"scale-{uuid.uuid4().hex[:6]}-"
    yield store, prefix
    with store.db.tx() as conn:
        conn.execute(text("DELETE FROM dtask_schedules WHERE name LIKE :p"), {"p": prefix + "%"})


def clone(store: ScheduleStore, prefix: str, count: int, due_in: str) -> None:
    """``count`` copies of an hourly schedule, each due ``due_in`` from now (an interval)."""
    store.save(Schedule(prefix + "0", "print_range", {"n": 1}, Timing(3600)), replace=False)
    with store.db.tx() as conn:
        conn.execute(
            text(
                "INSERT INTO dtask_schedules (name, template, variables, every_seconds, timezone,"
                " misfire, overlap, misfire_grace, catch_up_window, decided_until, next_due_at)"
                " SELECT :p || g, template, variables, every_seconds, timezone, misfire, overlap,"
                " misfire_grace, catch_up_window, now(), now() + CAST(:due AS interval)"
                " FROM dtask_schedules k, generate_series(1, :n) g WHERE k.name = :p || '0'"
            ),
            {"p": prefix, "n": count, "due": due_in},
        )
        conn.execute(
            text(
                "UPDATE dtask_schedules SET next_due_at = now() + CAST(:due AS interval)"
                " WHERE name = :p || '0'"
            ),
            {"p": prefix, "due": due_in},
        )


def counting(prefix: str, seen: list[str], pause: float = 0.0) -> Decide:
    def decide(schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        assert schedule.decided_until is not None
        if not schedule.name.startswith(prefix):  # another test's: left as it was
            return Firing([], schedule.decided_until, schedule.buffered, changed=False)
        seen.append(schedule.name)
        time.sleep(pause)
        return Firing([], schedule.decided_until, None, changed=False,
                      due_at=now + timedelta(hours=1))  # fmt: skip

    return decide


def test_a_pass_reads_only_the_schedules_that_are_due(
    many: tuple[ScheduleStore, str],
) -> None:
    store, prefix = many
    clone(store, prefix, 20_000, "1 hour")
    with store.db.tx() as conn:
        conn.execute(
            text("UPDATE dtask_schedules SET next_due_at = now() WHERE name IN (:a, :b, :c)"),
            {"a": prefix + "7", "b": prefix + "70", "c": prefix + "700"},
        )
    seen: list[str] = []
    fired = store.beat_pass(counting(prefix, seen), hold_for=10)
    assert sorted(seen) == sorted([prefix + "7", prefix + "70", prefix + "700"])
    assert fired.next_due is not None
    seen.clear()
    store.beat_pass(counting(prefix, seen), hold_for=10)
    assert seen == []  # decided until their next slot, an hour ahead


def test_a_cold_pass_over_thousands_of_due_schedules_commits_in_chunks_within_the_limit(
    many: tuple[ScheduleStore, str],
) -> None:
    """3,000 due schedules whose decisions take 1 ms each: 3 s of deciding against a 2 s
    limit on how long a pass's transaction may sit idle; chunks of 500 commit as they go
    (a chunk takes about 0.5 s: a 1 s limit left a loaded machine too little room)."""
    store, prefix = many
    clone(store, prefix, 2_999, "-1 second")
    seen: list[str] = []
    store.beat_pass(counting(prefix, seen, pause=0.001), hold_for=2.0)
    assert len(seen) == len(set(seen)) == 3_000
    with store.db.tx() as conn:
        due = conn.execute(
            text(
                "SELECT count(*) FROM dtask_schedules WHERE name LIKE :p AND next_due_at <= now()"
            ),
            {"p": prefix + "%"},
        ).scalar_one()
    assert due == 0
