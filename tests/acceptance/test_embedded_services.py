"""The embedded services: watched under `dtask up`, announced by workers, never mixed with
shared ones."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtask import services
from dtask.services import embedded
from tests.conftest import DTASK, REPO
from tests.support import ports
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


@pytest.fixture
def up(tmp_path: Path, dtask_env: dict[str, str]) -> Iterator[tuple[dict[str, str], Path]]:
    """`dtask up` with one worker on embedded services of its own."""
    env = {**dtask_env, "DTASK_HOME": str(tmp_path / "home")}
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [DTASK, "up", "--workers", "1", "--no-flower", "--no-beat",
             "--api-port", str(ports.free_port())],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_for(lambda: "Ctrl-C stops everything" in log.read_text(), 90, "dtask up")
        yield env, log
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        embedded.stop(tmp_path / "home")


def _pid(pidfile: Path) -> int:
    return int(pidfile.read_text().split()[0])


def test_up_restarts_embedded_services_that_died_and_runs_still_finish(
    up: tuple[dict[str, str], Path],
) -> None:
    env, log = up
    home = Path(env["DTASK_HOME"])
    first_line = (home / "logs" / "worker-1.log").read_text().splitlines()[0]
    assert "using the embedded PostgreSQL and Redis in" in first_line
    assert "only this machine sees" in first_line

    os.kill(_pid(home / "redis" / "redis.pid"), signal.SIGKILL)
    os.kill(_pid(home / "postgres" / "postmaster.pid"), signal.SIGKILL)
    wait_for(lambda: "the embedded Redis had stopped; restarted it" in log.read_text(), 60, "Redis")
    wait_for(
        lambda: "the embedded PostgreSQL had stopped; restarted it" in log.read_text(), 60, "pg"
    )
    result = subprocess.run(
        [DTASK, "submit", "print_range", "-e", "n=50", "--wait", "--timeout", "120", "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["state"] == "succeeded"


@pytest.mark.parametrize("command", [["worker"], ["submit", "print_range", "-e", "n=5"]])
def test_a_mix_of_shared_and_embedded_services_is_refused_in_one_line(
    dtask_env: dict[str, str], tmp_path: Path, command: list[str]
) -> None:
    home = tmp_path / "home"
    env = {**dtask_env, "DTASK_HOME": str(home), "DTASK_BROKER_URL": "redis://127.0.0.1:1/0"}
    try:
        result = subprocess.run(
            [DTASK, *command], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )
    finally:
        embedded.stop(home)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert (
        "DTASK_BROKER_URL and DTASK_RESULT_BACKEND are set but DTASK_DATABASE_URL is not"
        in (lines[0])
    )
    assert not (home / "postgres").exists() and not embedded.redis_socket(home).exists()


def test_explicit_urls_of_the_embedded_services_are_not_a_mix(dtask_env: dict[str, str]) -> None:
    resolved = services.ensure_broker()
    env = {
        **dtask_env,
        "DTASK_DATABASE_URL": resolved.database_url,
        "DTASK_BROKER_URL": resolved.broker_url,
    }
    result = subprocess.run(
        [DTASK, "submit", "print_range", "-e", "n=5", "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
