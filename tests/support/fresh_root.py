"""``python -m tests.support.fresh_root DIR N``, run by root inside ``unshare --mount``: the
machine as a fresh one is, where pgserver has not yet added its system user. ``/etc`` is a
copy of its own (bind-mounted: the host's users stay as they are) with no ``pgserver`` user;
then N first starts of the embedded PostgreSQL at once, each under a DTASK_HOME of its own
in DIR, as a parallel test run's processes start theirs. Prints a JSON list, one entry per
start: ``"ok"`` or its error's last line. Every server started is stopped before it exits."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = """
import sys, time
from pathlib import Path
from dtask.services import embedded
embedded._quiet_import_pgserver()
Path(sys.argv[2] + ".ready").touch()
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.001)
embedded.postgres_url(Path(sys.argv[2]))
"""


def _private_etc() -> None:
    """A copy of /etc without the user and group ``pgserver``, edited directly: ``userdel``
    refuses while the host's embedded servers run as that user (the suite's other processes)."""
    copy = Path(tempfile.mkdtemp(prefix="etc-"))
    shutil.copytree("/etc", copy, symlinks=True, dirs_exist_ok=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        path = copy / name
        if path.exists():
            kept = [x for x in path.read_text().splitlines(True) if not x.startswith("pgserver:")]
            path.write_text("".join(kept))
    subprocess.run(["mount", "--bind", str(copy), "/etc"], check=True)
    present = subprocess.run(["getent", "passwd", "pgserver"], capture_output=True, check=False)
    if present.returncode == 0:
        raise SystemExit("the user pgserver is still there in this namespace")


def _stop(home: Path) -> None:
    pidfile = home / "postgres" / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)  # immediate shutdown; not pkill -u: the uid is shared
        for _ in range(200):
            os.kill(pid, 0)
            time.sleep(0.05)


def main() -> None:
    root, count = Path(sys.argv[1]), int(sys.argv[2])
    _private_etc()
    go = root / "go"
    homes = [root / f"h{i}" for i in range(count)]
    argv = [sys.executable, "-c", START, str(go)]
    starts = [
        subprocess.Popen([*argv, str(home)], stderr=subprocess.PIPE, text=True) for home in homes
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{home}.ready").exists() for home in homes):  # each imported, waiting
        if time.monotonic() > deadline or any(s.poll() is not None for s in starts):
            break
        time.sleep(0.01)
    go.touch()
    outcomes = []
    try:
        for start in starts:
            _, err = start.communicate(timeout=120)
            lines = err.strip().splitlines() or ["?"]
            outcomes.append("ok" if start.returncode == 0 else lines[-1][:300])
    finally:
        for home in homes:
            _stop(home)
    json.dump(outcomes, sys.stdout)


if __name__ == "__main__":
    main()
