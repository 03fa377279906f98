"""What `dtask up` does to look after its stack: one stack per home, a process that exits is
started again after a growing pause, and logs are rotated at a bounded size.

The home's lock is an ``flock`` held for the life of `dtask up`: the kernel drops it with the
process, so a killed `dtask up` leaves no stale lock. ``up.json`` beside it says where the
running stack is, for a second `dtask up` and for ``--attach``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from dtask.exceptions import StackRunning

RESTART_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # seconds before each restart in a row
STEADY = 60.0  # seconds up after which an exit is not part of a crash loop
LOG_BYTES = 10 * 2**20  # a log past this is rotated (copied to .1, then emptied)
LOG_KEEP = 2  # rotated files kept: name.log.1 and name.log.2


@dataclass
class Backoff:
    """Pauses before a process's restarts: doubling while it keeps exiting soon after its
    start, from the first again once it stayed up ``STEADY`` seconds."""

    in_a_row: int = 0
    said: str = ""  # the error said at the last exit
    times: int = 0  # exits in a row with that error

    def next(self, uptime: float) -> float:
        if uptime >= STEADY:
            self.in_a_row = 0
        delay = RESTART_DELAYS[min(self.in_a_row, len(RESTART_DELAYS) - 1)]
        self.in_a_row += 1
        return delay


_PR_SET_PDEATHSIG = 1
_prctl = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)  # Linux's; looked up once


def ends_with_its_parent() -> None:
    """In a stack's child between fork and exec: SIGTERM when `dtask up` dies, even by SIGKILL
    (a worker then hands its children over as on any stop), so no unsupervised process is left
    to run beside the next `dtask up` of this home. Nothing where the kernel has no prctl."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def exit_status(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


_ERROR = re.compile(r"error|errno|exception|refused|denied|not found", re.IGNORECASE)


def last_error(output: str, within: int = 10) -> str:
    """The line of a process's output that says why it failed: of its last ``within`` lines,
    the last that names an error (uvicorn's "[Errno 98] ... address already in use" comes
    before its shutdown lines; a traceback's last line is its error), else its last line. Only
    the last few: a worker's log holds its children's errors of hours before."""
    lines = [ln.strip() for ln in output.splitlines()[-4 * within :] if ln.strip()][-within:]
    return next((ln for ln in reversed(lines) if _ERROR.search(ln)), lines[-1] if lines else "")


def exited(
    name: str, code: int, uptime: float, output: str, log: Path, backoff: Backoff
) -> tuple[str, float]:
    """One line on a process that exited: how, the last line it wrote when it failed (a
    traceback's last line is the error; in a crash loop, said once), and when it is started
    again; and the seconds until then (``backoff`` moves on)."""
    error = last_error(output) if code > 0 else ""
    delay = backoff.next(uptime)
    again = backoff.in_a_row > 1 and error == backoff.said
    backoff.times = backoff.times + 1 if again else 1
    backoff.said = error
    said = f"dtask up: {name} exited ({exit_status(code)}) after {uptime:.0f} s"
    if error and again:
        said += f", the same error ({backoff.times} times in a row)"
    elif error:
        said += f": {error[:200]}"
    return f"{said}; restarting it in {delay:g} s (see {log})", delay


def rotate(log: Path, most: int = LOG_BYTES, keep: int = LOG_KEEP) -> bool:
    """Copy a log past ``most`` bytes to ``.1`` (older ones shift up to ``.keep``) and empty
    it in place: its process writes on (its file is opened for appending), and a restart
    never empties it."""
    try:
        if log.stat().st_size <= most:
            return False
    except FileNotFoundError:
        return False
    for n in range(keep, 1, -1):
        older = log.with_name(f"{log.name}.{n - 1}")
        if older.exists():
            older.replace(log.with_name(f"{log.name}.{n}"))
    shutil.copyfile(log, log.with_name(f"{log.name}.1"))
    with log.open("r+b") as out:
        out.truncate(0)
    return True


def _lock_path(home: Path) -> Path:
    return home / "up.lock"


def _about_path(home: Path) -> Path:
    return home / "up.json"


@contextlib.contextmanager
def one_stack(home: Path) -> Iterator[Callable[[list[str]], None]]:
    """Hold the home's stack lock while the block runs; StackRunning if another `dtask up`
    holds it. Yields how to record the stack's description (its lines) for others."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = _lock_path(home).open("a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackRunning(_already(home)) from None
        about = _about_path(home)

        def record(lines: list[str]) -> None:
            made = about.with_name(f".{about.name}.{os.getpid()}")
            since = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            made.write_text(json.dumps({"pid": os.getpid(), "since": since, "lines": lines}))
            made.replace(about)

        try:
            yield record
        finally:
            about.unlink(missing_ok=True)
    finally:
        handle.close()


def running(home: Path) -> dict[str, Any] | None:
    """The running stack's description (pid, since, lines), None when no `dtask up` holds the
    home's lock."""
    lock = _lock_path(home)
    if not lock.exists():
        return None
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass
        else:
            return None
    try:
        about: dict[str, Any] = json.loads(_about_path(home).read_text())
    except (FileNotFoundError, ValueError):
        return {"pid": None, "since": None, "lines": []}  # starting: not described yet
    return about


def how_to_stop(about: dict[str, Any]) -> str:
    """How to stop the running stack ``running`` described."""
    pid = about.get("pid")
    return "stop it with Ctrl-C where it runs" + (f" (or kill {pid})" if pid else "")


def _already(home: Path) -> str:
    about = running(home) or {}
    pid, since = about.get("pid"), about.get("since")
    where = f"pid {pid}, up since {since}" if pid else "starting"
    return (
        f"a dtask up already runs in {home} ({where}; logs in {home / 'logs'}): follow it with"
        f" `dtask up --attach`, {how_to_stop(about)}, or set another DTASK_HOME for a second"
        " stack"
    )


def follow(home: Path, out: IO[str], stopping: Callable[[float], bool]) -> bool:
    """``--attach``: print the running stack's description, then each new line of its logs
    (``worker-1 | ...``) until ``stopping`` (waited on between reads) says so or the stack
    stops. False when no stack runs."""
    about = running(home)
    if about is None:
        return False
    print(
        f"dtask up runs in {home} (pid {about.get('pid')}, since {about.get('since')}):", file=out
    )
    for line in about.get("lines", []):
        print(f"  {line}", file=out)
    print("Ctrl-C stops following (the stack keeps running).", file=out, flush=True)
    logs = home / "logs"
    at = {p: p.stat().st_size for p in logs.glob("*.log")}
    while not stopping(0.5):
        for path in sorted(logs.glob("*.log")):
            size = path.stat().st_size
            start = at.get(path, 0)
            if size < start:  # rotated meanwhile
                start = 0
            if size > start:
                with path.open("rb") as log:
                    log.seek(start)
                    chunk = log.read(size - start)
                kept = chunk[: chunk.rfind(b"\n") + 1]  # whole lines only
                for line in kept.decode(errors="replace").splitlines():
                    print(f"{path.stem} | {line}", file=out)
                at[path] = start + len(kept)
        out.flush()
        if running(home) is None:
            print("dtask up: the stack stopped", file=out, flush=True)
            break
    return True
