"""A schedule's backfill (issue 43): one run per slot of a range, in slot order, exactly once
per slot however often it is run, paced by --max-running, a dependent schedule's slots each
after its upstream's; against a real worker."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

import dtask
from dtask import services
from tests.conftest import DTASK, REPO, WorkerProcess, running_workers

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def worker(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with running_workers(dtask_env, tmp_path_factory.mktemp("backfill"), 1, "-c", "2") as [one]:
        yield one


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, "schedule", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )


def daily(env: dict[str, str], template: str, *args: str) -> str:
    name = f"bf-{uuid.uuid4().hex[:8]}"
    added = cli(env, "add", name, template, *args, "--cron", "0 2 * * *", "--tz", "Europe/Berlin")
    assert added.returncode == 0, added.stderr
    return name


def backfill(env: dict[str, str], name: str, *args: str) -> dict[str, object]:
    done = cli(env, "backfill", name, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_thirty_one_days_once_each_in_slot_order(
    worker: WorkerProcess, dtask_env: dict[str, str]
) -> None:
    name = daily(dtask_env, "print_range", "-e", "n=10")
    march = ("--from", "2026-03-01", "--to", "2026-03-31T23:59")
    first = backfill(dtask_env, name, *march)
    assert (first["slots"], first["created"], first["existing"]) == (31, 31, 0)
    runs = [dtask.get_run(int(i)) for i in first["runs"]]  # type: ignore[union-attr]
    statuses = [run.wait(timeout=180) for run in runs]
    assert all(s.state is dtask.RunState.SUCCEEDED for s in statuses)
    slots = [s.slot for s in statuses]
    assert slots == sorted(slots) and len(set(slots)) == 31
    # 02:00 in Berlin, the clocks going forward on March 29th (UTC+1, then UTC+2)
    assert slots[0] == datetime(2026, 3, 1, 1, tzinfo=UTC)
    assert slots[-1] == datetime(2026, 3, 31, 0, tzinfo=UTC)
    assert [s.id for s in statuses] == sorted(s.id for s in statuses)  # created in slot order
    assert all(
        s.key == f"schedule:{name}:{s.slot.isoformat().replace('+00:00', 'Z')}"
        for s in statuses
        if s.slot
    )
    again = backfill(dtask_env, name, *march)
    assert (again["created"], again["existing"], again["runs"]) == (0, 31, first["runs"])
    wider = backfill(dtask_env, name, "--from", "2026-02-28", "--to", "2026-03-02T23:00")
    assert (wider["created"], wider["existing"]) == (1, 2)  # only Feb 28th is new


def test_max_running_paces_the_runs(worker: WorkerProcess, dtask_env: dict[str, str]) -> None:
    name = daily(dtask_env, "slow_range", "-e", "n=20", "-e", "delay=0.05")  # ~1 s each
    done = backfill(
        dtask_env, name, "--from", "2026-01-01", "--to", "2026-01-06T23:00", "--max-running", "2"
    )
    assert done["created"] == 6
    statuses = [dtask.get_run(int(i)).wait(timeout=180) for i in done["runs"]]  # type: ignore[union-attr]
    for s in statuses:
        out = [
            o
            for o in statuses
            if o.created_at < s.created_at and o.finished_at and o.finished_at > s.created_at
        ]
        assert len(out) <= 1, f"run {s.id} was created while {len(out)} others were unfinished"


def test_a_dependent_schedule_follows_slot_by_slot(
    worker: WorkerProcess, dtask_env: dict[str, str]
) -> None:
    upstream = daily(dtask_env, "print_range", "-e", "n=5")
    after = f"bf-{uuid.uuid4().hex[:8]}"
    added = cli(dtask_env, "add", after, "print_range", "-e", "n=5", "--cron", "0 3 * * *",
                "--tz", "Europe/Berlin", "--after-schedule", upstream)  # fmt: skip
    assert added.returncode == 0, added.stderr
    days = ("--from", "2026-04-01", "--to", "2026-04-03T23:00")
    ups = backfill(dtask_env, upstream, *days)["runs"]
    downs = backfill(dtask_env, after, *days)["runs"]
    for up, down in zip(ups, downs, strict=True):  # type: ignore[call-overload]
        assert services.store().runs.status(int(down)).after == (int(up),)
        assert dtask.get_run(int(down)).wait(timeout=180).state is dtask.RunState.SUCCEEDED


def test_bad_ranges_are_one_line_and_create_nothing(dtask_env: dict[str, str]) -> None:
    name = daily(dtask_env, "print_range", "-e", "n=5")
    every = f"bf-{uuid.uuid4().hex[:8]}"
    assert cli(dtask_env, "add", every, "print_range", "-e", "n=5", "--every", "1").returncode == 0
    for args, error in (
        ((name, "--from", "2026-03-02", "--to", "2026-03-01"), "is before its --from"),
        ((every, "--from", "2026-03-01", "--to", "2026-03-02"), "holds over 10,000 slots"),
        (("no-such", "--from", "2026-03-01", "--to", "2026-03-02"), "no schedule named 'no-such'"),
        ((name, "--from", "March", "--to", "2026-03-02"), "is not an ISO 8601 time"),
        ((name, "--from", "2026-03-01", "--to", "2026-03-02", "--max-running", "0"), "max_running"),
    ):
        done = cli(dtask_env, "backfill", *args)
        assert done.returncode == 2 and error in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert services.store().runs.statuses(limit=5, schedule=name) == []
    for schedule in (name, every):
        dtask.remove_schedule(schedule)
