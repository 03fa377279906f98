"""PostgreSQL connections a busy `dtask worker` holds, per process, from pg_stat_activity
(sampled every 50 ms while a run of short children goes through), and whether N such workers
start beside each other on one embedded PostgreSQL (max_connections 100, as a stock one).

    .venv/bin/python -m bench.connections [--concurrency 2 8] [--workers 3]

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--workers", type=int, default=3, help="started side by side")
    parser.add_argument("--children", type=int, default=500)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dtask-connections-"))
    (work / "sink").mkdir()
    for name in [n for n in os.environ if n.startswith("DTASK_")]:
        del os.environ[name]
    os.environ.update(
        DTASK_HOME=str(work / "home"),
        DTASK_TEMPLATES="tests.support.templates",
        DTASK_TEST_SINK=str(work / "sink"),
        PYTHONPATH=str(REPO),
    )
    import dtask
    from dtask import services
    from dtask.services import embedded

    store = services.store()
    dtask_bin = str(Path(sys.executable).with_name("dtask"))
    rows = []
    try:
        for concurrency in args.concurrency:
            started: list[subprocess.Popen[bytes]] = []
            refused = ""
            for i in range(args.workers):
                log = (work / f"c{concurrency}-w{i}.log").open("wb")
                proc = subprocess.Popen(
                    [dtask_bin, "worker", "-c", str(concurrency), "-n", f"c{concurrency}w{i}@%h",
                     "--without-mingle", "--without-gossip"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
                )  # fmt: skip
                started.append(proc)
                if not wait_ready(proc, Path(log.name)):
                    refused = Path(log.name).read_text(errors="replace").strip().splitlines()[-1]
                    break
            live = [p for p in started if p.poll() is None]
            most: dict[int, int] = {}
            stop = threading.Event()
            pids = {p.pid: [c.pid for c in psutil.Process(p.pid).children()] for p in live}
            everyone = [pid for main, pool in pids.items() for pid in [main, *pool]]
            sampler = threading.Thread(target=sample, args=(store, everyone, most, stop))
            sampler.start()
            if live:
                run = dtask.submit("slow_range", {"n": 20 * args.children, "delay": 0.0005})
                run.wait(timeout=600)
            stop.set()
            sampler.join()
            for main, pool in pids.items():
                in_pool = [most.get(p, 0) for p in pool]
                rows.append(
                    f"| -c {concurrency} | {main} | {most.get(main, 0)} | {sum(in_pool)}"
                    f" ({max(in_pool, default=0)} per process at most) |"
                    f" {most.get(main, 0) + sum(in_pool)} |"
                )
            rows.append(
                f"| -c {concurrency} | {len(live)} of {args.workers} started |"
                f" {refused or 'none refused'} | | |"
            )
            for proc in started:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in started:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
            with store.db.tx() as conn:
                conn.execute(text("DELETE FROM dtask_workers"))
    finally:
        services.reset()
        embedded.stop(work / "home")
        shutil.rmtree(work, ignore_errors=True)
    print("| workers | main pid | main process (most) | pool processes (sum of most) | worker |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


def sample(store: Any, pids: list[int], most: dict[int, int], stop: threading.Event) -> None:
    """The most connections each of ``pids`` holds at once, until ``stop``."""
    apps = [f"dtask:{pid}" for pid in pids]
    while not stop.is_set():
        with store.db.tx() as conn:
            for app, n in conn.execute(
                text(
                    "SELECT application_name, count(*) FROM pg_stat_activity"
                    " WHERE application_name = ANY(:a) GROUP BY 1"
                ),
                {"a": apps},
            ):
                pid = int(app.split(":")[1])
                most[pid] = max(most.get(pid, 0), int(n))
        time.sleep(0.05)


def wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if " ready." in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


if __name__ == "__main__":
    sys.exit(main())
