"""`dtask up` looks after its stack (issue 42): one per home, a killed worker started again,
logs appended to and followed from another terminal."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from dtask.services import embedded
from tests.acceptance.test_first_hour import one_line
from tests.conftest import DTASK, REPO
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def _worker_main(name: str, home: Path) -> psutil.Process:
    """The worker's main process in ``home``'s stack (its pool processes share its command
    line: the oldest). Other tests' stacks name their workers alike."""
    found = []
    for proc in psutil.process_iter(["cmdline", "create_time"]):
        if f"{name}@%h" in " ".join(proc.info["cmdline"] or []):
            try:
                if proc.environ().get("DTASK_HOME") == str(home):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    assert found, f"no process of {name} in {home}"
    return min(found, key=lambda p: p.info["create_time"])


def test_one_up_per_home_restarts_a_killed_worker_and_is_followed_from_elsewhere(
    tmp_path: Path, dtask_env: dict[str, str]
) -> None:
    env = {**dtask_env, "DTASK_HOME": str(tmp_path / "home")}
    said = tmp_path / "up.log"

    def dtask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )

    with said.open("wb") as out, (tmp_path / "attach.log").open("wb") as followed:
        up = subprocess.Popen(
            [DTASK, "up", "--workers", "1", "--no-flower", "--no-beat", "--no-api"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        attach: subprocess.Popen[bytes] | None = None
        try:
            wait_for(lambda: "Ctrl-C stops everything" in said.read_text(), 120, "dtask up")
            one_line(dtask("up", "--no-flower", "--no-api"), 2, "a dtask up already runs in")
            one_line(dtask("down"), 2, f"a dtask up runs in {tmp_path / 'home'} (pid {up.pid})")
            attach = subprocess.Popen(
                [DTASK, "up", "--attach"], env=env, cwd=REPO, stdout=followed,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            attached = tmp_path / "attach.log"
            wait_for(lambda: "Ctrl-C stops following" in attached.read_text(), 60, "--attach")
            _worker_main("worker-1", tmp_path / "home").send_signal(signal.SIGKILL)
            wait_for(lambda: "worker-1 started again" in said.read_text(), 60, "a restart")
            assert "worker-1 exited (killed by SIGKILL) after" in said.read_text()
            done = dtask("submit", "print_range", "--var", "n=20", "--wait", "--timeout", "90")
            assert done.returncode == 0, done.stderr  # the new worker runs it
            log = (tmp_path / "home" / "logs" / "worker-1.log").read_text()
            assert log.count(" ready.") == 2, "the restart emptied the log"
            wait_for(lambda: "worker-1 | " in attached.read_text(), 30, "followed lines")
            up.send_signal(signal.SIGINT)
            assert up.wait(60) == 0
            assert attach.wait(30) == 0
            assert "dtask up: the stack stopped" in attached.read_text()
        finally:
            for proc in (up, attach):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
    one_line(dtask("up", "--attach"), 2, "no dtask up runs in")


def test_read_only_commands_never_start_the_local_stack(
    tmp_path: Path, dtask_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**dtask_env, "DTASK_HOME": str(home)}

    def dtask(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
        )

    down = f"the local stack in {home} is not running (its PostgreSQL is stopped): start it"
    for command in (["runs"], ["status", "1"], ["workers"], ["schedule", "list"]):
        one_line(dtask(*command), 2, down)
    assert not (home / "postgres").exists()
    assert dtask("migrate").returncode == 0  # starts the embedded services
    try:
        shown = dtask("runs", "--json")
        assert shown.returncode == 0 and shown.stdout.strip() == "[]", shown.stderr
        assert dtask("down").returncode == 0
        one_line(dtask("runs"), 2, down)
        assert not embedded.postgres_alive(home)
    finally:
        embedded.stop(home)


def _stack_processes(home: Path) -> list[str]:
    """The stack's own processes in ``home`` (workers, beat): not its embedded services."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "dtask.cli" not in line or " up" in line:
            continue
        try:
            if proc.environ().get("DTASK_HOME") == str(home):
                found.append(line[:100])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_a_killed_up_takes_its_workers_and_beat_with_it(
    tmp_path: Path, dtask_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    env = {**dtask_env, "DTASK_HOME": str(home)}
    said = tmp_path / "up.log"
    with said.open("wb") as out:
        up = subprocess.Popen(
            [DTASK, "up", "--workers", "1", "--no-flower", "--no-api"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: "Ctrl-C stops everything" in said.read_text(), 120, "dtask up")
            assert len(_stack_processes(home)) >= 2  # a worker (and its pool), the beat
            up.send_signal(signal.SIGKILL)
            up.wait(10)
            wait_for(lambda: not _stack_processes(home), 60, "the stack's processes to end")
        finally:
            if up.poll() is None:
                up.kill()
            embedded.stop(home)
