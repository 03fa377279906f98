"""Schedules end to end: real `dtask beat` processes (two at once, one SIGKILLed), a real
worker, the CLI, and PostgreSQL as the judge of which slots ran."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import NamedTuple

import pytest
from sqlalchemy import text

from dtask import services
from dtask.client.schedules import remove_schedule
from dtask.exceptions import DtaskError
from tests.conftest import DTASK, REPO, BeatProcess, WorkerProcess
from tests.support import cli_batch
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance
SECOND = timedelta(seconds=1)


class SlotRun(NamedTuple):
    id: int
    slot: datetime
    state: str
    created_at: datetime
    finished_at: datetime | None


def runs_of(schedule: str) -> list[SlotRun]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, slot, state, created_at, finished_at FROM dtask_runs"
                " WHERE schedule = :s ORDER BY slot"
            ),
            {"s": schedule},
        )
        return [SlotRun(*row) for row in rows]


def misfire_alert(schedule: str) -> str:
    """The open misfire alert's message, or ''."""
    found = [
        a.message
        for a in services.store().alerts.open()
        if (a.kind, a.subject) == ("schedule_misfired", schedule)
    ]
    return found[0] if found else ""


def dtask(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def add(env: dict[str, str], name: str, *args: str) -> None:
    result = dtask(env, "schedule", "add", name, *args)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def worker(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    process = WorkerProcess(dtask_env, tmp_path_factory.mktemp("sched") / "w.log", "-c", "4")
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@pytest.fixture
def beats(dtask_env: dict[str, str], tmp_path: Path) -> Iterator[list[BeatProcess]]:
    """Start beats with ``beats.append(BeatProcess(...))``; all are stopped afterwards."""
    started: list[BeatProcess] = []
    try:
        yield started
    finally:
        for beat in started:
            beat.stop()


@pytest.fixture
def names(dtask_env: dict[str, str]) -> Iterator[list[str]]:
    """Unique schedule names, removed afterwards (runs stay, as `rm` promises)."""
    made: list[str] = []
    yield made
    for name in made:  # in this process: `schedule rm`'s own test is the lifecycle's above
        with contextlib.suppress(DtaskError):
            remove_schedule(name)


def new_name(names: list[str], label: str) -> str:
    names.append(f"{label}-{uuid.uuid4().hex[:6]}")
    return names[-1]


def start_beat(env: dict[str, str], beats: list[BeatProcess], log: Path) -> BeatProcess:
    beat = BeatProcess(env, log)
    beats.append(beat)
    beat.wait_ready()
    return beat


def test_two_beats_one_killed_fire_every_slot_exactly_once(
    dtask_env: dict[str, str],
    worker: WorkerProcess,
    beats: list[BeatProcess],
    names: list[str],
    tmp_path: Path,
) -> None:
    for i in range(2):
        start_beat(dtask_env, beats, tmp_path / f"beat{i}.log")
    name = new_name(names, "ha")
    add(dtask_env, name, "print_range", "-e", "n=5", "--every", "1")
    time.sleep(15)
    # Kill the beat that fired the latest slot, so the survivor has to take over.
    latest = runs_of(name)[-1].id
    active = next(b for b in beats if f"triggered run {latest}\n" in b.output())
    active.kill()
    killed_at = services.store().runs.status(latest).created_at
    time.sleep(15)
    assert dtask(dtask_env, "schedule", "pause", name).returncode == 0
    time.sleep(1)

    runs = runs_of(name)
    slots = [r.slot for r in runs]
    assert len(slots) >= 28, slots
    assert len(set(slots)) == len(slots)  # exactly one run per slot
    assert all(b - a == SECOND for a, b in itertools.pairwise(slots)), slots
    assert sum(r.created_at > killed_at + 2 * SECOND for r in runs) >= 10
    survivor = next(b for b in beats if b is not active)
    assert "triggered run" in survivor.output()
    wait_for(lambda: all(r.state == "succeeded" for r in runs_of(name)), 60, "runs to succeed")


def test_misfire_policies_after_every_beat_was_down_for_ten_slots(
    dtask_env: dict[str, str],
    worker: WorkerProcess,
    beats: list[BeatProcess],
    names: list[str],
    tmp_path: Path,
) -> None:
    policies = {p: new_name(names, p.replace("_", "-")) for p in ("skip", "run_once", "catch_up")}
    beat = start_beat(dtask_env, beats, tmp_path / "before.log")
    for policy, name in policies.items():
        add(dtask_env, name, "print_range", "-e", "n=1", "--every", "1", "--misfire", policy,
            "--grace", "2")  # fmt: skip
    time.sleep(4)
    beat.stop()
    before = {p: [r.slot for r in runs_of(n)] for p, n in policies.items()}
    last = max(before["skip"])
    assert all(max(s) == last for s in before.values()), before  # decided in one pass
    time.sleep(12)  # no beat: ten slots and more are missed
    start_beat(dtask_env, beats, tmp_path / "after.log")
    time.sleep(4)
    for name in policies.values():  # the monitor (in the worker) raises the misfire alert
        wait_for(partial(misfire_alert, name), 60, f"the misfire alert of {name}")
        missed = services.store().counters.all()["schedule_slots_missed"][name]
        assert missed >= 10 and f"{int(missed)} slot(s) after" in misfire_alert(name)
        assert dtask(dtask_env, "schedule", "pause", name).returncode == 0

    after = {p: [r.slot for r in runs_of(n) if r.slot > last] for p, n in policies.items()}
    resumed = after["skip"][0]
    gap = int((resumed - last) / SECOND) - 1
    assert gap >= 10, after["skip"]  # skip: the missed slots never ran
    assert after["run_once"][0] == resumed - SECOND  # run_once: only the latest missed slot
    assert after["run_once"][1] == resumed
    catch_up = after["catch_up"]  # catch_up: every missed slot, then on as usual
    assert catch_up[: gap + 1] == [last + SECOND * (i + 1) for i in range(gap + 1)]
    for slots in after.values():
        assert len(set(slots)) == len(slots)
        tail = [s for s in slots if s >= resumed]
        assert all(b - a == SECOND for a, b in itertools.pairwise(tail)), slots


def test_overlap_skip_and_buffer_one_with_runs_longer_than_the_interval(
    dtask_env: dict[str, str],
    worker: WorkerProcess,
    beats: list[BeatProcess],
    names: list[str],
    tmp_path: Path,
) -> None:
    skip, buffer_one = new_name(names, "ov-skip"), new_name(names, "ov-buffer")
    start_beat(dtask_env, beats, tmp_path / "beat.log")
    for name, policy in ((skip, "skip"), (buffer_one, "buffer_one")):
        # One child of 20 items x 0.25 s: each run takes about 5 s; a slot comes every 2 s.
        add(dtask_env, name, "slow_range", "-e", "n=20", "-e", "delay=0.25",
            "--every", "2", "--overlap", policy)  # fmt: skip
    time.sleep(24)
    for name in (skip, buffer_one):
        assert dtask(dtask_env, "schedule", "pause", name).returncode == 0
    for name in (skip, buffer_one):
        wait_for(lambda n=name: all(r.finished_at for r in runs_of(n)), 60, f"{name} to finish")

    for name in (skip, buffer_one):
        runs = runs_of(name)
        assert len(runs) >= 3, runs
        assert all(r.state == "succeeded" for r in runs)
        for previous, run in itertools.pairwise(runs):
            assert previous.finished_at is not None
            assert run.created_at >= previous.finished_at  # runs never overlap

    for previous, run in zip(runs_of(skip), runs_of(skip)[1:], strict=False):
        # skip: slots that came while a run was going were dropped; the next slot after it
        # finished started the next run.
        assert previous.finished_at is not None
        assert run.slot - previous.slot >= 4 * SECOND
        assert run.slot > previous.finished_at - SECOND
        assert run.slot - previous.finished_at <= 2 * SECOND + SECOND

    for previous, run in zip(runs_of(buffer_one), runs_of(buffer_one)[1:], strict=False):
        # buffer_one: the first slot from a run's start on waited and started the moment it
        # finished (later slots during that run were dropped).
        assert previous.finished_at is not None
        assert previous.created_at - SECOND < run.slot <= previous.created_at + 2 * SECOND
        assert run.created_at - previous.finished_at <= 2 * SECOND


def test_changes_take_effect_without_restarting_beat_and_runs_show_their_slot(
    dtask_env: dict[str, str],
    worker: WorkerProcess,
    beats: list[BeatProcess],
    names: list[str],
    tmp_path: Path,
) -> None:
    start_beat(dtask_env, beats, tmp_path / "beat.log")
    name = new_name(names, "live")
    added = time.monotonic()
    add(dtask_env, name, "print_range", "-e", "n=3", "--every", "1")
    # the running beat reads the new schedule (no restart): its first run within seconds, as
    # a busy machine's seconds go (5.15 s once under 4 test processes)
    wait_for(lambda: runs_of(name), 15, "the new schedule's first run")
    assert time.monotonic() - added < 15

    paused = dtask(dtask_env, "schedule", "pause", name)
    paused_at = runs_of(name)[-1].slot
    assert paused.returncode == 0 and f"schedule {name}  print_range  paused" in paused.stdout
    count = len(runs_of(name))
    time.sleep(3)
    assert len(runs_of(name)) <= count + 1  # at most a pass that was already under way

    shown = json.loads(dtask(dtask_env, "schedule", "show", name, "--json").stdout)
    assert shown["enabled"] is False and shown["every"] == 1 and shown["variables"] == {"n": 3}
    listed = json.loads(dtask(dtask_env, "schedule", "list", "--json").stdout)
    assert name in [s["name"] for s in listed]

    run = runs_of(name)[0]
    status = json.loads(dtask(dtask_env, "status", str(run.id), "--json").stdout)
    assert status["schedule"] == name
    assert status["key"] == f"schedule:{name}:{status['slot'][:19]}Z"
    human = dtask(dtask_env, "status", str(run.id)).stdout
    assert f"schedule   {name}, slot " in human
    runs = json.loads(dtask(dtask_env, "runs", "--json", "--limit", "500").stdout)
    assert any(r["key"] == status["key"] for r in runs)

    with services.store().engine.connect() as conn:
        before_resume = conn.execute(text("SELECT now()")).scalar_one()
    assert dtask(dtask_env, "schedule", "resume", name).returncode == 0
    wait_for(lambda: runs_of(name)[-1].slot > before_resume, 15, "a run after resume")
    paused_slots = [r.slot for r in runs_of(name) if paused_at + SECOND < r.slot < before_resume]
    assert paused_slots == []  # resumed from now: the paused slots are not caught up

    removed = dtask(dtask_env, "schedule", "rm", name)
    assert removed.returncode == 0 and "its runs stay" in removed.stdout
    assert runs_of(name)
    missing = dtask(dtask_env, "schedule", "show", name)
    assert missing.returncode == 2
    assert missing.stderr == (
        f"dtask: error: no schedule named '{name}' (see `dtask schedule list`)\n"
    )


BAD_SCHEDULES: list[tuple[list[str], str]] = [
    (["print_range", "-e", "n=5", "--cron", "61 * * * *"], "'61 * * * *': bad minute field"),
    (["print_range", "-e", "n=5", "--cron", "0 0 30 2 *"], "never fires"),
    (["print_range", "-e", "n=abc", "--every", "5"], "variable 'n' must be int"),
    (["print_range", "--every", "5"], "needs 'n'"),
    (["print_range", "-e", "n=5", "-e", "m=1", "--every", "5"], "has no parameter 'm'"),
    (["print_range", "-e", "n=1000000000", "--every", "5"], "children"),
    (["nope", "--every", "5"], "unknown template 'nope'"),
    (["print_range", "-e", "n=5", "--every", "5", "--tz", "Mars/Base"], "unknown time zone"),
    (["print_range", "-e", "n=5"], "one of the arguments --cron --every is required"),
    (["print_range", "-e", "n=5", "--every", "5", "--overlap", "x"], "invalid choice: 'x'"),
    (["print_range", "-e", "n=5", "--every", "5", "--start", "soon"], "not an ISO 8601"),
]


@pytest.fixture(scope="module")
def bad_schedules(dtask_env: dict[str, str]) -> list[cli_batch.Outcome]:
    """For each bad schedule, `dtask schedule add` then `dtask schedule show` of its name, all
    in one process (tests/support/cli_batch.py)."""
    tag = uuid.uuid4().hex[:6]
    commands = [
        argv
        for i, (args, _) in enumerate(BAD_SCHEDULES)
        for argv in (
            ["schedule", "add", f"bad{i}-{tag}", *args],
            ["schedule", "show", f"bad{i}-{tag}"],
        )
    ]
    return cli_batch.run_all(dtask_env, commands)


@pytest.mark.parametrize("case", range(len(BAD_SCHEDULES)), ids=[m for _, m in BAD_SCHEDULES])
def test_bad_schedules_get_one_line_and_save_nothing(
    bad_schedules: list[cli_batch.Outcome], case: int
) -> None:
    message = BAD_SCHEDULES[case][1]
    added, shown = bad_schedules[2 * case], bad_schedules[2 * case + 1]
    assert added.code == 2
    assert added.stderr.count("\n") == 1 and message in added.stderr, added.stderr
    assert "Traceback" not in added.stderr
    assert shown.code == 2, shown.stdout


def test_a_schedule_after_another_runs_each_slot_once_after_the_same_slot_upstream(
    dtask_env: dict[str, str],
    worker: WorkerProcess,
    beats: list[BeatProcess],
    names: list[str],
    tmp_path: Path,
) -> None:
    for i in range(2):
        start_beat(dtask_env, beats, tmp_path / f"beat{i}.log")
    extract, load = new_name(names, "extract"), new_name(names, "load")
    add(dtask_env, extract, "slow_range", "-e", "n=20", "-e", "delay=0.05", "--every", "2")
    add(dtask_env, load, "print_range", "-e", "n=5", "--every", "2", "--after-schedule", extract)
    shown = dtask(dtask_env, "schedule", "show", load)
    assert f"after      schedule {extract}" in shown.stdout, shown.stdout
    wait_for(lambda: sum(r.state == "succeeded" for r in runs_of(load)) >= 5, 120, "5 load slots")
    for name in (load, extract):
        assert dtask(dtask_env, "schedule", "pause", name).returncode == 0
    upstream = {r.slot: r for r in runs_of(extract)}
    loads = runs_of(load)
    assert len({r.slot for r in loads}) == len(loads)  # each slot once
    store = services.store()
    for run in loads:
        status = store.runs.status(run.id)
        up = upstream[run.slot]  # the same slot of extract
        assert status.after == (up.id,), (run, status.after)
        if run.state == "succeeded":
            first = store.children.page(run.id, None, 1, None)[0]
            assert first.started_at is not None and up.finished_at is not None
            assert first.started_at >= up.finished_at
    cycle = dtask(dtask_env, "schedule", "add", extract, "slow_range", "-e", "n=20", "-e",
                  "delay=0.05", "--every", "2", "--after-schedule", load, "--replace")  # fmt: skip
    assert cycle.returncode == 2 and "already runs after" in cycle.stderr, cycle.stderr
    missing = dtask(dtask_env, "schedule", "add", new_name(names, "x"), "print_range", "-e",
                    "n=1", "--every", "2", "--after-schedule", "no-such-schedule")  # fmt: skip
    assert missing.returncode == 2 and "no such schedule" in missing.stderr, missing.stderr
