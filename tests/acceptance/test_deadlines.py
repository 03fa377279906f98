"""Delay tolerance with a real worker: a run none of whose children can start (its queue has
no consumer) is marked late by the reaper once its deadline passes; with --on-late fail it is
failed instead, with an error that says so."""

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


def status(env: dict[str, str], run_id: int) -> dict[str, Any]:
    shown = dtask_cli(env, "status", str(run_id), "--json")
    result: dict[str, Any] = json.loads(shown.stdout)
    assert shown.returncode == (1 if result["state"] in ("failed", "cancelled") else 0)
    return result


def test_a_run_that_cannot_start_in_time_is_late_or_failed(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**dtask_env, **QUICK}
    worker = WorkerProcess(env, tmp_path / "w.log", "-c", "1")  # not the queue 'special'
    runs: list[int] = []
    try:
        worker.wait_ready()
        for on_late in ("run", "fail"):
            made = dtask_cli(
                env, "submit", "routed", "-e", "n=10", "--delay-tolerance", "1",
                "--on-late", on_late, "--json",
            )  # fmt: skip
            assert made.returncode == 0, made.stderr
            runs.append(json.loads(made.stdout)["id"])
        late_run, failed_run = runs
        failed = wait_for(
            lambda: (s := status(env, failed_run))["state"] == "failed" and s, 30, "the late fail"
        )
        assert failed["late"] is True
        assert "not started within its delay tolerance of 1 s" in failed["error"]
        assert "failed instead of running late" in failed["error"]
        late = wait_for(lambda: (s := status(env, late_run))["late"] and s, 30, "the late mark")
        assert late["state"] == "running" and late["deadline"] is not None
        text = dtask_cli(env, "status", str(late_run)).stdout
        assert "(late)" in text
        assert f"reaper: run {failed_run} is late" in worker.output()
        on_time = dtask_cli(
            env, "submit", "free_form", "-e", "steps=1", "--delay-tolerance", "30", "--wait",
            "--json",
        )  # fmt: skip
        assert json.loads(on_time.stdout)["state"] == "succeeded", on_time.stderr
    finally:
        for run_id in runs:
            if status(env, run_id)["state"] == "running":
                dtask.get_run(run_id).cancel()
        worker.stop()


def test_bad_tolerances_are_one_line(dtask_env: dict[str, str]) -> None:
    for value, message in (("soon", "--delay-tolerance expects a number of seconds"),
                           ("0", "delay tolerance must be over 0 and at most")):  # fmt: skip
        result = dtask_cli(dtask_env, "submit", "routed", "-e", "n=10", "--delay-tolerance", value)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1
