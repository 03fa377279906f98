"""`dtask up`'s supervision (dtask/local/supervisor.py): restart pauses, exit lines, log
rotation under a writing process, one stack per home."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.exceptions import StackRunning
from dtask.local import supervisor
from dtask.local.supervisor import (
    RESTART_DELAYS,
    STEADY,
    Backoff,
    exited,
    last_error,
    rotate,
)

LOG = Path("/home/x/.dtask/logs/worker-1.log")


@given(st.lists(st.floats(0, 3 * STEADY), max_size=30))
def test_pauses_double_while_it_keeps_exiting_and_start_over_once_it_stayed_up(
    uptimes: list[float],
) -> None:
    backoff, previous = Backoff(), 0.0
    for uptime in uptimes:
        delay = backoff.next(uptime)
        if uptime >= STEADY or previous == 0.0:
            assert delay == RESTART_DELAYS[0]
        else:
            assert delay == min(2 * previous, RESTART_DELAYS[-1])
        previous = delay


def test_a_kill_says_its_signal_and_a_failure_its_last_line_once_in_a_loop() -> None:
    backoff = Backoff()
    said, delay = exited("worker-1", -signal.SIGKILL, 35.2, "ready.\n", LOG, backoff)
    assert said == (f"dtask up: worker-1 exited (killed by SIGKILL) after 35 s; restarting it in"
                    f" 1 s (see {LOG})")  # fmt: skip
    assert delay == 1
    failed = "Traceback (most recent call last):\n  ...\nSyntaxError: invalid syntax\n\n"
    said, delay = exited("worker-1", 1, 0.8, failed, LOG, backoff)
    assert said.startswith("dtask up: worker-1 exited (exit code 1) after 1 s: SyntaxError:")
    assert "restarting it in 2 s" in said and delay == 2
    said, delay = exited("worker-1", 1, 0.9, failed, LOG, backoff)
    assert ", the same error (2 times in a row); restarting it in 4 s" in said
    said, _ = exited("worker-1", 1, 0.9, "NameError: x\n", LOG, backoff)
    assert ": NameError: x; restarting it in 8 s" in said


UVICORN = """INFO:     Started server process [4242]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 17777): address \
already in use
INFO:     Waiting for application shutdown.
INFO:     Application shutdown complete.
"""


def test_the_line_that_says_why_comes_before_a_server_s_shutdown_lines() -> None:
    assert last_error(UVICORN).startswith("ERROR:    [Errno 98] error while attempting to bind")
    assert last_error("starting\nstopped\n") == "stopped"  # no error named: the last line
    assert last_error("") == ""
    old = "[ERROR] child 3 failed: RuntimeError\n" + "ok\n" * 20 + "Worker stopped\n"
    assert last_error(old) == "Worker stopped"  # an error of long before is not the cause
    said, _ = exited("api", 1, 0.5, UVICORN, LOG, Backoff())
    assert ": ERROR:    [Errno 98]" in said


WRITER = """
import sys, time
with open(sys.argv[1], "ab", buffering=0) as log:
    for i in range(int(sys.argv[2])):
        log.write(b"%06d .......................................\\n" % i)
        if i % 50 == 0:
            time.sleep(0.001)
"""


def test_a_log_rotates_while_its_process_writes_keeping_two_and_losing_little(
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker-1.log"
    lines = 20_000  # 48 bytes each, 960,000 bytes in all
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(lines)])
    rotations = 0
    while writer.poll() is None:
        rotations += rotate(log, most=100_000)
    writer.wait()
    rotations += rotate(log, most=100_000)
    assert rotations >= 3
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["worker-1.log", "worker-1.log.1", "worker-1.log.2"]
    assert log.stat().st_size <= 100_000
    text = b"".join(p.read_bytes() for p in (log.with_name(f"{log.name}.2"),
                                             log.with_name(f"{log.name}.1"), log))  # fmt: skip
    assert b"\0" not in text  # appended, not written at an old offset past the new end
    assert text.endswith(b"%06d .......................................\n" % (lines - 1))


def test_one_stack_per_home_and_its_description_for_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert supervisor.running(home) is None
    with supervisor.one_stack(home) as record:
        record(["api       http://127.0.0.1:8123/api/v1"])
        about = supervisor.running(home)
        assert about is not None and about["pid"] == os.getpid()
        assert about["lines"] == ["api       http://127.0.0.1:8123/api/v1"]
        with pytest.raises(StackRunning) as refused, supervisor.one_stack(home):
            pass
        message = str(refused.value)
        assert f"a dtask up already runs in {home} (pid {os.getpid()}, up since" in message
        assert "dtask up --attach" in message and "another DTASK_HOME" in message
    assert supervisor.running(home) is None
    assert not (home / "up.json").exists()
    with supervisor.one_stack(home):  # free again
        pass
