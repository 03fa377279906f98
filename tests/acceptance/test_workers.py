"""Live workers in PostgreSQL: `dtask workers` lists what each consumes and its child slots; a
worker that stops leaves at once, a killed one once it has not been seen for a while; a submit
that no live worker can serve says so."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import dtask
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

QUICK = {"DTASK_REAPER_INTERVAL": "0.5", "DTASK_LEASE_TTL": "3", "DTASK_HEARTBEAT_INTERVAL": "0.5"}


def dtask_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def listed(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    result = dtask_cli(env, "workers", "--json")
    assert result.returncode == 0, result.stderr
    return {w["name"]: w for w in json.loads(result.stdout)}


def test_workers_report_their_queues_and_slots_and_leave(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**dtask_env, **QUICK}
    fixed = WorkerProcess(env, tmp_path / "a.log", "-c", "3", "-Q", "dtask,special", "-n", "a@%h")
    scaled = WorkerProcess(env, tmp_path / "b.log", "--autoscale", "4,1", "-n", "b@%h")
    try:
        fixed.wait_ready()
        scaled.wait_ready()
        found = wait_for(lambda: len(listed(env)) >= 2 and listed(env), 30, "both workers listed")
        a = next(w for name, w in found.items() if name.startswith("a@"))
        b = next(w for name, w in found.items() if name.startswith("b@"))
        assert (a["queues"], a["slots"], a["pid"]) == (["dtask", "special"], 3, fixed.proc.pid)
        assert (b["queues"], b["slots"]) == (["dtask"], 4)
        fixed.stop()  # a clean stop removes it at once
        assert not any(n.startswith("a@") for n in listed(env))
        scaled.kill()  # a killed one drops out once not seen for max(3 reaper passes, a lease)
        wait_for(lambda: not listed(env), 30, "the killed worker to drop out")
        text = dtask_cli(env, "workers")
        assert text.stdout.startswith("no live worker")
    finally:
        fixed.stop()
        scaled.stop()


def test_a_submit_nobody_can_serve_says_so(dtask_env: dict[str, str]) -> None:
    result = dtask_cli(dtask_env, "submit", "routed", "-e", "n=10")
    assert result.returncode == 0, result.stderr
    run_id = int(result.stdout.split()[1])
    try:
        assert (
            f"dtask: note: no live worker consumes queue 'special'; run {run_id} waits until one"
            " starts (`dtask worker -Q special`)"
        ) in result.stderr
    finally:
        dtask.get_run(run_id).cancel()


def test_a_tiered_submit_nobody_can_serve_names_the_worker_to_start(
    dtask_env: dict[str, str],
) -> None:
    result = dtask_cli(dtask_env, "submit", "routed", "-e", "n=10", "--tier", "premium", "--json")
    assert result.returncode == 0, result.stderr
    run = json.loads(result.stdout)
    try:
        assert run["tier"] == "premium"
        assert (
            f"no live worker consumes queue 'special.premium'; run {run['id']} waits until one"
            " starts (`dtask worker -Q special --tier premium`)"
        ) in result.stderr
        shown = dtask_cli(dtask_env, "status", str(run["id"]))
        assert "client     default, priority 5, tier premium" in shown.stdout
    finally:
        dtask.get_run(run["id"]).cancel()
