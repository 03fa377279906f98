"""Why a run waits (issue 42): each reason `dtask status`, the Python API and `--wait` give,
from the facts the dispatcher reads, against real worker processes; a run's reason changes
as its world does."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dtask
from dtask.domain.waiting import Reason, Waiting
from tests.conftest import DTASK, REPO, WorkerProcess, running_workers
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

LONG = 120.0  # seconds a reason may take to show on a busy machine (a worker's report, a pass)


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def cancel(*runs: dtask.Run) -> None:
    for run in runs:
        with contextlib.suppress(dtask.DtaskError):  # one that finished meanwhile
            run.cancel()


def reason_of(run: dtask.Run, expected: Reason, saying: str = "") -> Waiting:
    """The run's reason once it is ``expected`` (and says ``saying``); the reasons it went
    through, in the failure."""
    seen: list[Waiting | None] = []

    def check() -> Waiting | None:
        seen.append(run.waiting())
        found = seen[-1]
        return found if found and found.reason is expected and saying in found.text else None

    try:
        return wait_for(check, LONG, f"run {run.id} to wait for {expected.value}")  # type: ignore[no-any-return]
    except AssertionError as exc:
        changes = [w for i, w in enumerate(seen) if i == 0 or w != seen[i - 1]]
        raise AssertionError(f"{exc}; its reasons: {changes}") from None


@pytest.fixture(scope="module")
def worker(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with running_workers(dtask_env, tmp_path_factory.mktemp("why"), 1, "-c", "1") as [one]:
        yield one


def test_with_no_live_worker_status_and_wait_say_so(dtask_env: dict[str, str]) -> None:
    run = dtask.submit("slow_range", {"n": 20, "delay": 0.01})
    try:
        found = reason_of(run, Reason.NO_WORKER)
        assert "start one (`dtask worker` or `dtask up`)" in found.text
        shown = cli(dtask_env, "status", str(run.id))
        assert f"  why        {found.text}" in shown.stdout, shown.stdout
        waited = cli(dtask_env, "status", str(run.id), "--watch", "--timeout", "3")
        assert waited.returncode == 3, waited.stderr
        assert f"run {run.id}: no live worker" in waited.stderr
        assert "it waits because no live worker" in waited.stderr  # the timeout's line
    finally:
        cancel(run)


def test_a_queue_no_worker_consumes(worker: WorkerProcess, dtask_env: dict[str, str]) -> None:
    run = dtask.submit("routed", {"n": 10})
    try:
        found = reason_of(run, Reason.NO_QUEUE_WORKER)
        assert found.text.startswith("no live worker consumes queue special (workers consume: ")
        shown = json.loads(cli(dtask_env, "status", str(run.id), "--json").stdout)
        assert shown["waiting_reason"] == "no_queue_worker"
        assert shown["waiting_because"] == found.text
    finally:
        cancel(run)


@dtask.template("only_here", params={"n": int}, skeleton={"n": "${n}"}, split=lambda r: [r])
def only_here(ctx: dtask.ChildContext, n: int) -> None:
    """Registered in this test's process alone: no worker knows it."""


def test_a_template_no_worker_knows(worker: WorkerProcess) -> None:
    run = dtask.submit("only_here", {"n": 1})
    try:
        found = reason_of(run, Reason.UNKNOWN_TEMPLATE)
        assert found.text.startswith("no live worker knows template 'only_here' (workers have: ")
        assert re.search(r"\(workers have: (\w+, ){4}\w+ and \d+ more\)$", found.text), found.text
    finally:
        cancel(run)


def test_workers_that_run_an_older_file_are_named(
    worker: WorkerProcess, dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """A template added to a file after its worker started: the run says the worker runs an
    older version of that file (it would run the run after a restart)."""
    code = tmp_path / "code"
    code.mkdir()
    jobs = code / "stalejobs.py"
    one = (
        "@dtask.template('{0}', params={{'n': int}}, skeleton={{'n': '${{n}}'}},"
        " split=lambda r: [r])"
    )
    jobs.write_text(
        f"import dtask\n\n{one.format('stale_one')}\ndef stale_one(ctx, n):\n    pass\n"
    )
    env = {
        **dtask_env,
        "PYTHONPATH": f"{code}:{REPO}",
        "DTASK_TEMPLATES": "tests.support.templates,stalejobs",
    }
    old = WorkerProcess(env, tmp_path / "old.log", "-c", "1", "-n", "old@%h")
    try:
        old.wait_ready()
        loaded = jobs.stat().st_mtime_ns
        jobs.write_text(
            f"{jobs.read_text()}\n{one.format('stale_two')}\ndef stale_two(ctx, n):\n    pass\n"
        )
        os.utime(jobs, ns=(loaded + 10**9, loaded + 10**9))  # later, on any clock's grain
        sys.path.insert(0, str(code))
        try:
            importlib.import_module("stalejobs")
        finally:
            sys.path.remove(str(code))
        run = dtask.submit("stale_two", {"n": 1})
        try:
            found = reason_of(run, Reason.STALE_CODE)
            assert "workers run an older version of stalejobs.py (changed since old@" in found.text
        finally:
            cancel(run)
    finally:
        old.stop()
        sys.modules.pop("stalejobs", None)


def test_a_client_at_its_max_running(worker: WorkerProcess) -> None:
    dtask.set_client("why-capped", max_running=1)
    run = dtask.submit("slow_range", {"n": 60, "delay": 0.25}, client="why-capped")
    try:
        found = reason_of(run, Reason.CLIENT_MAX_RUNNING)
        assert found.text == "client why-capped is at --max-running 1 (1 child running or queued)"
    finally:
        cancel(run)


def test_higher_priorities_then_busy_slots_then_nothing(worker: WorkerProcess) -> None:
    """One slot: a run behind another's children of higher priority says how many; at the
    same priority it shares the busy slot; once the other ends it waits no more."""
    first = dtask.submit("slow_range", {"n": 400, "delay": 0.05}, priority=8)
    low = dtask.submit("slow_range", {"n": 200, "delay": 0.01}, priority=2)
    try:
        found = reason_of(low, Reason.PRIORITY)
        assert (
            found.text.startswith("behind ") and "of higher priority in queue dtask" in found.text
        )
        cancel(first)
        same = dtask.submit("slow_range", {"n": 200, "delay": 0.05}, priority=2)
        try:
            found = reason_of(low, Reason.SLOTS_BUSY, saying="shared fairly with 1 other run;")
            assert found.text.startswith("all 1 slots of queue dtask are busy, shared fairly")
        finally:
            cancel(same)
        low.wait(timeout=LONG)
        assert low.waiting() is None
    finally:
        cancel(first, low)


def test_upstreams_and_a_later_start(worker: WorkerProcess, dtask_env: dict[str, str]) -> None:
    upstream = dtask.submit("slow_range", {"n": 400, "delay": 0.05})
    after = dtask.submit("slow_range", {"n": 20, "delay": 0.01}, after=[upstream])
    later = dtask.submit("slow_range", {"n": 20, "delay": 0.01}, countdown=600)
    try:
        found = reason_of(after, Reason.UPSTREAM)
        assert found.text.startswith(f"waits for run {upstream.id} (")
        found = reason_of(later, Reason.START_AFTER)
        assert "(in 9 min" in found.text or "(in 10 min" in found.text
        waited = cli(dtask_env, "submit", "slow_range", "--var", "n=20", "--var", "delay=0.01",
                     "--after", str(upstream.id), "--wait", "--timeout", "4")  # fmt: skip
        assert waited.returncode == 3, waited.stderr
        assert f": waits for run {upstream.id} (" in waited.stderr
    finally:
        cancel(upstream, after, later)
