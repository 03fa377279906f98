"""Schedules in a real PostgreSQL: saving, pausing, and beat passes that race each other."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

import dtask
from dtask import services, templating
from dtask.db.schedules import Decide, Fired, Firing, ScheduleStore
from dtask.domain.clients import DEFAULT_CLIENT, Client
from dtask.domain.runs import NewRun
from dtask.domain.schedules import Schedule, Timing, trigger_key
from dtask.exceptions import ScheduleExists, ScheduleNotFound


@pytest.fixture
def schedules(dtask_env: dict[str, str]) -> ScheduleStore:
    return services.store().schedules


@pytest.fixture
def name(schedules: ScheduleStore) -> Iterator[str]:
    unique = f"it-{uuid.uuid4().hex[:8]}"
    yield unique
    with contextlib.suppress(ScheduleNotFound):
        schedules.remove(unique)


def every(name: str, seconds: int, n: int = 1) -> Schedule:
    return Schedule(name, "print_range", {"n": n}, Timing(seconds))


def db_now(schedules: ScheduleStore) -> datetime:
    with schedules.db.engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()  # type: ignore[no-any-return]


def test_save_is_idempotent_and_refuses_another_definition_unless_replaced(
    schedules: ScheduleStore, name: str
) -> None:
    first, created = schedules.save(every(name, 5), replace=False)
    assert created and first.decided_until is not None
    again, created_again = schedules.save(every(name, 5), replace=False)
    assert not created_again and again == first
    with pytest.raises(ScheduleExists, match="exists with another definition"):
        schedules.save(every(name, 5, n=2), replace=False)
    with schedules.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE dtask_schedules SET buffered_slot = now() WHERE name = :n"), {"n": name}
        )
    same_trigger, _ = schedules.save(every(name, 5, n=3), replace=True)
    assert same_trigger.variables == {"n": 3} and same_trigger.buffered is not None
    replaced, _ = schedules.save(every(name, 7, n=2), replace=True)
    assert replaced.timing.trigger == 7 and replaced.variables == {"n": 2}
    assert replaced.buffered is None  # a slot of the old trigger does not run later
    assert replaced.decided_until == first.decided_until  # what was decided stays decided
    assert name in [s.name for s in schedules.all()]


def test_pause_and_resume_from_now(schedules: ScheduleStore, name: str) -> None:
    saved, _ = schedules.save(every(name, 5), replace=False)
    assert not schedules.set_enabled(name, False).enabled
    resumed = schedules.set_enabled(name, True)
    assert resumed.enabled and resumed.decided_until is not None
    assert saved.decided_until is not None and resumed.decided_until > saved.decided_until
    schedules.remove(name)
    for operation in (lambda: schedules.get(name), lambda: schedules.remove(name)):
        with pytest.raises(ScheduleNotFound, match=f"no schedule named '{name}'"):
            operation()


def fire_every_slot(mine: str, seen: list[str]) -> Decide:
    """A decide that fires each due slot of ``mine`` and leaves other schedules alone."""

    def decide(schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        assert schedule.decided_until is not None
        if schedule.name != mine:
            return Firing([], schedule.decided_until, schedule.buffered)
        seen.append(schedule.name)
        slots = schedule.timing.slots(schedule.decided_until, now, 100)
        runs = [
            NewRun("print_range", trigger_key(mine, s), {"n": 1}, 1, None, mine, s).charged_to(
                Client(DEFAULT_CLIENT)
            )
            for s in slots
        ]
        return Firing(runs, now, None)

    return decide


def test_racing_beat_passes_decide_each_slot_once(schedules: ScheduleStore, name: str) -> None:
    schedules.save(every(name, 1), replace=False)
    seen: list[str] = []
    decide = fire_every_slot(name, seen)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            schedules.beat_pass(decide, hold_for=10)

    beats = [threading.Thread(target=beat) for _ in range(4)]
    for b in beats:
        b.start()
    stop.wait(3.5)
    stop.set()
    for b in beats:
        b.join()
    with schedules.db.engine.connect() as conn:
        slots = [
            row.slot
            for row in conn.execute(
                text("SELECT slot FROM dtask_runs WHERE schedule = :s ORDER BY slot"), {"s": name}
            )
        ]
    assert len(slots) >= 3 and len(seen) >= len(slots)  # (a busy machine: one pass per slot)
    assert len(set(slots)) == len(slots)  # one run per slot
    assert all(b - a == timedelta(seconds=1) for a, b in itertools.pairwise(slots))
    assert schedules.get(name).last_run_id is not None


def test_a_pass_that_dies_midway_records_nothing(schedules: ScheduleStore, name: str) -> None:
    saved, _ = schedules.save(every(name, 1), replace=False)
    start = db_now(schedules)
    while db_now(schedules) < start + timedelta(seconds=1.2):
        pass

    class Killed(BaseException):
        """The process dying mid-pass (an exception of one schedule is that schedule's)."""

    def dies(schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        fired = fire_every_slot(name, [])(schedule, now, previous_running)
        if schedule.name == name:
            raise Killed("beat killed")
        return fired

    with pytest.raises(Killed):
        schedules.beat_pass(dies, hold_for=10)
    assert schedules.get(name).decided_until == saved.decided_until
    with schedules.db.engine.connect() as conn:
        count = conn.execute(
            text("SELECT count(*) FROM dtask_runs WHERE schedule = :s"), {"s": name}
        ).scalar_one()
    assert count == 0


def test_a_template_schedules_itself_from_python(schedules: ScheduleStore, name: str) -> None:
    import dtask
    from dtask.examples import print_range

    saved = print_range.schedule("*/5 * * * *", name=name, n=100)
    assert print_range.schedule("*/5 * * * *", name=name, n=100) == saved  # at every start
    assert saved.timing.describe() == "cron */5 * * * * (UTC)" and saved.variables == {"n": 100}
    changed = print_range.schedule(name=name, every=30, tz="Europe/Berlin", n=7)
    assert changed.timing.trigger == 30 and changed.variables == {"n": 7}
    assert dtask.get_schedule(name) == changed
    with pytest.raises(dtask.InvalidVariables, match="must be int"):
        print_range.schedule("*/5 * * * *", name=name, n="many")
    with pytest.raises(dtask.InvalidSchedule, match="hour field"):
        print_range.schedule("0 25 * * *", name=name, n=1)
    assert dtask.get_schedule(name) == changed  # a refused change changes nothing
    assert dtask.pause_schedule(name).enabled is False
    assert [s.name for s in dtask.list_schedules() if s.name == name] == [name]
    dtask.remove_schedule(name)


def pass_after_a_slot(schedules: ScheduleStore, fires: str, not_: str) -> Fired:
    """A beat pass once a slot of every-second schedules is due: ``fires`` fired, ``not_``
    did not."""
    from dtask.worker.beat import Pass

    start = db_now(schedules)
    while db_now(schedules) < start + timedelta(seconds=1.5):
        time.sleep(0.1)
    fired = schedules.beat_pass(Pass().decide, hold_for=10)
    assert any(run.schedule == fires for _, run in fired.created)
    assert not any(run.schedule == not_ for _, run in fired.created + fired.existing)
    return fired


def test_a_schedule_this_beat_cannot_run_keeps_its_slots_and_spares_the_others(
    schedules: ScheduleStore, name: str
) -> None:
    from dtask.worker.beat import Pass

    templating.load_templates()
    broken = f"{name}-broken"
    try:
        schedules.save(every(name, 1), replace=False)
        saved, _ = schedules.save(every(broken, 1), replace=False)
        with schedules.db.engine.begin() as conn:  # as seen by a beat without that template
            conn.execute(
                text("UPDATE dtask_schedules SET template = 'gone' WHERE name = :n"), {"n": broken}
            )
        pass_after_a_slot(schedules, name, broken)
        after = schedules.get(broken)
        assert after.decided_until == saved.decided_until  # its slots are still due
        assert after.last_error is not None and "unknown template 'gone'" in after.last_error
        with schedules.db.engine.connect() as conn:
            stamp = "SELECT updated_at FROM dtask_schedules WHERE name = :n"
            before = conn.execute(text(stamp), {"n": broken}).scalar_one()
        time.sleep(1.2)  # a newer slot is due now: the error must still read the same
        schedules.beat_pass(Pass().decide, hold_for=10)
        with schedules.db.engine.connect() as conn:  # the same error is not written every pass
            assert conn.execute(text(stamp), {"n": broken}).scalar_one() == before
    finally:
        with contextlib.suppress(ScheduleNotFound):
            schedules.remove(broken)


def test_a_schedule_s_own_delay_tolerance_sets_its_runs_deadline_from_the_slot(
    schedules: ScheduleStore, name: str
) -> None:
    from dtask.domain.deadlines import OnLate
    from dtask.worker.beat import Pass

    templating.load_templates()
    timing = Timing(1, delay_tolerance=45.0, on_late=OnLate.FAIL)
    saved, _ = schedules.save(Schedule(name, "print_range", {"n": 1}, timing), replace=False)
    assert schedules.get(name).timing == timing  # kept as saved, not the template's (none)
    assert saved.as_json(db_now(schedules))["delay_tolerance"] == 45.0
    start = db_now(schedules)
    while db_now(schedules) < start + timedelta(seconds=1.5):
        time.sleep(0.1)
    fired = schedules.beat_pass(Pass().decide, hold_for=10)
    ours = [(run_id, run) for run_id, run in fired.created if run.schedule == name]
    assert ours
    for run_id, run in ours:
        assert (run.delay_tolerance, run.on_late) == (45.0, OnLate.FAIL)
        status = services.store().runs.status(run_id)
        assert run.slot is not None and status.deadline == run.slot + timedelta(seconds=45)
        dtask.get_run(run_id).cancel()


def test_a_schedule_whose_run_postgresql_refuses_fails_alone(
    schedules: ScheduleStore, name: str
) -> None:
    """One schedule's run that PostgreSQL refuses (on main: a delay tolerance of 1e16 s, its
    deadline past year 294,276; here a constraint the test adds for that schedule alone)
    rolled back the beat's whole chunk, so no other schedule fired for as long as it existed.
    Now it is decided under a savepoint: the error is its own, the others fire."""

    templating.load_templates()
    broken = f"{name}-zbad"
    refuse = f"it_refuse_{name[3:]}"
    try:
        schedules.save(every(name, 1), replace=False)
        schedules.save(every(broken, 1), replace=False)
        with schedules.db.engine.begin() as conn:
            conn.execute(
                text(
                    f"ALTER TABLE dtask_runs ADD CONSTRAINT {refuse}"
                    f" CHECK (schedule IS DISTINCT FROM '{broken}') NOT VALID"
                )
            )
        fired = pass_after_a_slot(schedules, name, broken)
        after = schedules.get(broken)
        assert after.last_error is not None and "not decided" in after.last_error
        assert refuse in after.last_error, after.last_error
        with schedules.db.engine.connect() as conn:
            due_in = conn.execute(
                text(
                    "SELECT extract(epoch FROM next_due_at - now()) FROM dtask_schedules"
                    " WHERE name = :n"
                ),
                {"n": broken},
            ).scalar_one()
        assert 30 < due_in <= 60  # looked at again in a minute, not in every pass
        for run_id, _ in fired.created:
            dtask.get_run(run_id).cancel()
    finally:
        with schedules.db.engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE dtask_runs DROP CONSTRAINT IF EXISTS {refuse}"))
        with contextlib.suppress(ScheduleNotFound):
            schedules.remove(broken)
