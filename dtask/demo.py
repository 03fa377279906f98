"""`make demo`: the sample job end to end on the embedded services, then everything stopped.

Starts the embedded PostgreSQL and Redis, two `dtask worker` processes, submits print_range,
shows progress, prints a summary and some of what the children printed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from dtask import embedded, services
from dtask.exceptions import DtaskError
from dtask.progress import Progress

WORKERS = 2


def _start_worker(index: int, logs: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = logs / f"worker-{index}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dtask.cli", "worker", "-c", "1", "--without-mingle",
             "--without-gossip", "--hostname", f"demo-{index}@%h"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return proc, log


def _wait_ready(logs: list[Path], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(" ready." in log.read_text(errors="replace") for log in logs):
            return
        time.sleep(0.2)
    raise DtaskError(f"workers did not start within {timeout:g} s; see {logs[0].parent}")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _show_sample(logs: list[Path]) -> None:
    printed = re.compile(r"\] (\d+)$")
    for log in logs:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if printed.search(ln)]
        if lines:
            print(
                f"  {log.name}: {len(lines):,} numbers printed, e.g. {lines[0].split('] ')[-1]}.."
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("-n", type=int, default=2_000_000, help="print 1..n (default 2,000,000)")
    parser.add_argument("--keep", action="store_true", help="leave PostgreSQL and Redis running")
    args = parser.parse_args(argv)

    procs: list[subprocess.Popen[bytes]] = []
    config = None
    try:
        resolved = services.current()
        config = resolved.settings
        services.store()
        print(f"dtask demo: embedded PostgreSQL and Redis under {config.home}")
        logs_dir = config.home / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        started = [_start_worker(i, logs_dir) for i in range(1, WORKERS + 1)]
        procs = [p for p, _ in started]
        logs = [log for _, log in started]
        _wait_ready(logs)
        print(f"dtask demo: {WORKERS} workers ready (logs in {logs_dir})")

        from dtask.client import submit

        began = time.monotonic()
        run = submit("print_range", {"n": args.n})
        print(f"dtask demo: submitted run {run.id}: print_range n={args.n:,}")
        status = run.wait(on_progress=Progress(sys.stdout))
        wall = time.monotonic() - began
        c = status.children
        print(f"run {status.id}: {status.state.value}")
        print(f"  children  {c.succeeded} succeeded, {c.failed} failed of {c.total}")
        print(f"  wall time {wall:.1f} s ({args.n / wall:,.0f} numbers/s)")
        _show_sample(logs)
        if status.error:
            print(f"  error     {status.error}")
        return 0 if status.state.value == "succeeded" else 1
    except DtaskError as exc:
        print(f"dtask demo: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dtask demo: interrupted", file=sys.stderr)
        return 130
    finally:
        _stop(procs)
        if config is not None and not args.keep and config.embedded_database:
            embedded.stop(config.home)


if __name__ == "__main__":
    sys.exit(main())
