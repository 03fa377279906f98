"""The soak's invariants (soak/checks.py) catch each breach they claim to, on made-up data."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from soak.checks import Outcome, Verdict
from soak.faults import Injection
from soak.monitor import FenceRegression, Monitor, RunObs

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
EVERY, GRACE = 5.0, 10.0
WITNESS = SimpleNamespace(name="w1")


def run(state: str = "succeeded", template: str = "soak_range", **kw: Any) -> RunObs:
    fields = {"schedule": None, "slot": None, "error": None, "created_at": T0, **kw}
    return RunObs(state, template, **fields)


class World:
    """One healthy soak's worth of data; each test breaks one thing."""

    def __init__(self, sink: Path) -> None:
        self.sink = sink
        self.runs = {1: run(), 2: run("failed", "soak_broken_split", error="SoakSplitError: x")}
        self.variables: dict[int, dict[str, float]] = {1: {"n": 60}, 2: {"n": 1}}
        self.write(1, 0, ["s 1", *map(str, range(1, 51))])
        self.write(1, 1, ["s 1", *map(str, range(51, 61))])
        for i in range(5):  # schedule slots T0, T0+5 s, ... T0+20 s
            slot = T0 + timedelta(seconds=EVERY * i)
            self.runs[10 + i] = run(schedule="pulse", slot=slot)
            self.variables[10 + i] = {"n": 1}
            self.write(10 + i, 0, ["s 1", "1"])
        self.end = (T0 + timedelta(seconds=4 * EVERY + GRACE + EVERY)).timestamp()
        self.outages: list[tuple[float, float]] = []
        self.cancels: Counter[int] = Counter()
        samples = [(float(t), 300 * 2**20) for t in range(50)]
        self.monitor = SimpleNamespace(
            regressions=[], polls=100, failed_polls=0, max_fence={(1, 0): 2},
            rss={"w1": samples}, cluster=SimpleNamespace(witness=lambda: WITNESS),
        )  # fmt: skip

    def write(self, run_id: int, index: int, lines: list[str]) -> None:
        (self.sink / f"{run_id}-{index}.txt").write_text("".join(f"{x}\n" for x in lines))

    def outcome(self) -> Outcome:
        injection = Injection("worker SIGKILL", 0.0, 0.0, "", {(1, 0): (1, 10)}, recovered_at=4.0)
        return Verdict(
            self.runs, self.variables, self.sink, cast(Monitor, self.monitor), [injection],
            self.cancels, ("pulse", EVERY, GRACE, self.end, self.outages),
        ).outcome()  # fmt: skip

    def failing(self) -> set[str]:
        return {i.name for i in self.outcome().invariants if not i.ok}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_healthy_soak_passes_every_invariant(world: World) -> None:
    outcome = world.outcome()
    assert world.failing() == set(), outcome.table()
    assert outcome.lost == 0 and outcome.reprinted == 0
    assert outcome.faults[1][:5] == ["worker SIGKILL", "1", "1", "4.0", "4.0"]


def test_a_run_left_running_or_a_range_run_that_failed(world: World) -> None:
    world.runs[1] = run("running")
    assert world.failing() == {"every run reached its final state"}
    world.runs[1] = run("failed", error="gave up")
    assert "every run reached its final state" in world.failing()


def test_a_broken_split_must_fail_with_the_users_exception(world: World) -> None:
    world.runs[2] = run("failed", "soak_broken_split", error="something else")
    assert world.failing() == {"every run reached its final state"}


def test_a_lost_number_and_reprints(world: World) -> None:
    world.write(1, 1, ["s 1", *map(str, range(51, 55)), "s 2", *map(str, range(53, 60))])
    outcome = world.outcome()
    assert {i.name for i in outcome.invariants if not i.ok} == {"every range printed completely"}
    assert (outcome.lost, outcome.reprinted) == (1, 2)


def test_a_child_that_ran_too_often(world: World) -> None:
    world.write(1, 1, ["s 1", "s 2", "s 3", "s 4", "s 5", "s 6", *map(str, range(51, 61))])
    assert world.failing() == {"no child ran more than max_attempts (5)"}


def test_one_attempt_started_twice_is_allowed_only_after_a_cancel(world: World) -> None:
    world.write(1, 1, ["s 1", "51", "s 1", *map(str, range(52, 61))])
    assert world.failing() == {"no child ran more than max_attempts (5)"}
    world.cancels[1] = 1
    assert world.failing() == set()


def test_a_first_take_started_again_only_after_a_fault_hit_the_child(world: World) -> None:
    """(1, 0) was running on what the fault hit; (1, 1) was not."""
    world.write(1, 0, ["s 1", *map(str, range(1, 21)), "s 1", *map(str, range(21, 51))])
    assert world.failing() == set()
    world.write(1, 0, ["s 1", "s 2", "s 2", *map(str, range(1, 51))])
    assert world.failing() == {"no child ran more than max_attempts (5)"}
    world.write(1, 0, ["s 1", *map(str, range(1, 51))])
    world.write(1, 1, ["s 1", "51", "s 1", *map(str, range(52, 61))])
    assert world.failing() == {"no child ran more than max_attempts (5)"}


def test_a_slot_run_twice_or_skipped_unless_postgresql_was_down(world: World) -> None:
    world.runs[99] = run(schedule="pulse", slot=T0 + timedelta(seconds=EVERY))
    world.variables[99] = {"n": 1}
    world.write(99, 0, ["s 1", "1"])
    assert world.failing() == {"schedule: each slot once, none skipped"}
    del world.runs[99]
    del world.runs[12]  # the slot T0+10 s is missing
    assert world.failing() == {"schedule: each slot once, none skipped"}
    due = (T0 + timedelta(seconds=2 * EVERY + GRACE)).timestamp()
    world.outages.append((due - 3, due + 1))
    assert world.failing() == set()


def test_a_fence_that_went_backwards(world: World) -> None:
    world.monitor.regressions = [FenceRegression((1, 0), 3, 2, 1.0)]
    assert world.failing() == {"no fence went backwards"}


def test_rss_that_keeps_growing(world: World) -> None:
    world.monitor.rss = {"w1": [(float(t), (300 + 10 * t) * 2**20) for t in range(50)]}
    assert world.failing() == {"worker RSS did not grow without bound"}
