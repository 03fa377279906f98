"""Resource tiers with real workers: work of a tier runs only on workers of that tier or a
higher one, an idle premium worker takes basic work, and it serves its own tier first."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import dtask
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def tiered_workers(dtask_env: dict[str, str], tmp_path: Path) -> Iterator[None]:
    """One basic worker and one premium worker, one slot each; children write their tag."""
    basic = WorkerProcess(
        {**dtask_env, "DTASK_TEST_TAG": "basic"}, tmp_path / "basic.log", "-c", "1", "-n", "b@%h"
    )
    premium = WorkerProcess(
        {**dtask_env, "DTASK_TEST_TAG": "premium"},
        tmp_path / "premium.log", "--tier", "premium", "-c", "1", "-n", "p@%h",
    )  # fmt: skip
    try:
        basic.wait_ready()
        premium.wait_ready()
        yield
    finally:
        basic.stop()
        premium.stop()


def submit(env: dict[str, str], n: int, delay: float, *options: str) -> int:
    done = subprocess.run(
        [DTASK, "submit", "tagged", "-e", f"n={n}", "-e", f"delay={delay}", "--json", *options],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["id"])


def starts(sink: Path, run_id: int) -> list[tuple[float, str, int]]:
    """(start time, worker tag, run) of each child of the run."""
    found = []
    for path in sink.glob(f"{run_id}-*.txt"):
        tag, at = path.read_text().split()
        found.append((float(at), tag, run_id))
    return found


def finish(run_id: int) -> None:
    assert dtask.get_run(run_id).wait(timeout=120).state is dtask.RunState.SUCCEEDED


def test_premium_work_stays_on_premium_workers_which_also_take_idle_basic_work(
    dtask_env: dict[str, str], tiered_workers: None, sink: Path
) -> None:
    alone = submit(dtask_env, 12, 0.3)  # basic, and the premium worker has nothing to do
    finish(alone)
    assert {tag for _, tag, _ in starts(sink, alone)} == {"basic", "premium"}

    backlog = submit(dtask_env, 30, 0.3)
    wait_for(lambda: len(starts(sink, backlog)) >= 4, 60, "the basic backlog to start")
    first = submit(dtask_env, 8, 0.3, "--tier", "premium")
    finish(first)
    finish(backlog)

    mine = sorted(starts(sink, first))
    assert {tag for _, tag, _ in mine} == {"premium"}, mine
    # Between the premium run's first and last start the premium worker started its own
    # children: at most one basic child (the one it had already taken) slipped in.
    on_premium = [s for s in sorted(starts(sink, backlog)) if s[1] == "premium"]
    between = [s for s in on_premium if mine[0][0] < s[0] < mine[-1][0]]
    print(
        f"\npremium run: {len(mine)} children on the premium worker; basic children it"
        f" started meanwhile: {len(between)}; basic children it took in all: {len(on_premium)}"
    )
    assert len(between) <= 1, between
    assert len(on_premium) >= 1  # idle before and after, it helped with the backlog


def test_a_client_tier_is_the_default_and_the_ceiling_of_its_runs(
    dtask_env: dict[str, str],
) -> None:
    dtask.set_client("tier-silver", tier="regular")
    try:
        asked = {None: "regular", "basic": "basic", "premium": "regular"}
        for wanted, got in asked.items():
            run = dtask.submit("tagged", {"n": 1, "delay": 0}, client="tier-silver", tier=wanted)
            try:
                assert run.status().tier.value == got
            finally:
                run.cancel()
        with pytest.raises(dtask.DtaskError, match="tier must be one of basic, regular, premium"):
            dtask.submit("tagged", {"n": 1, "delay": 0}, tier="gold")
    finally:
        dtask.remove_client("tier-silver")
