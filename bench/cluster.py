"""The benchmark's cluster: embedded PostgreSQL and Redis under a temporary DTASK_HOME, and
dtask or raw Celery workers as subprocesses with the same flags and concurrency."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER_FLAGS = ("--without-mingle", "--without-gossip", "--loglevel", "INFO")


def prepare_environment(**extra: str) -> Path:
    """A fresh DTASK_HOME in a temp dir; must run before dtask is imported. The dir (its
    database, a few hundred MB after a large run, and the workers' logs) is removed when the
    benchmark exits, unless DTASK_BENCH_KEEP=1."""
    work = Path(tempfile.mkdtemp(prefix="dtask-bench-"))
    if os.environ.get("DTASK_BENCH_KEEP") != "1":
        atexit.register(shutil.rmtree, work, ignore_errors=True)
    (work / "sink").mkdir()
    for name in [n for n in os.environ if n.startswith("DTASK_")]:
        del os.environ[name]
    os.environ.update(
        DTASK_HOME=str(work / "home"),
        DTASK_TEMPLATES="bench.templates",
        DTASK_BENCH_SINK=str(work / "sink"),
        PYTHONPATH=str(REPO),
        **extra,
    )
    atexit.register(_stop_services, work / "home")  # runs before the rmtree: LIFO
    return work


def _stop_services(home: Path) -> None:
    """The embedded PostgreSQL and Redis a benchmark started (one that ends without stopping
    them left a Redis server running after it)."""
    from dtask.services import embedded

    embedded.stop(home)


class Workers:
    """Worker subprocesses, each in its own session so a signal reaches only what we aim at."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.spawned = 0
        self.quiet: set[int] = set()  # workers that never log "ready." (WARNING level)

    def _spawn(self, argv: Sequence[str], name: str) -> subprocess.Popen[bytes]:
        self.spawned += 1
        path = self.work / f"{name}-{self.spawned}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
            )
        self.procs.append(proc)
        self.logs[proc.pid] = path
        return proc

    def ready(self, *procs: subprocess.Popen[bytes], timeout: float = 90) -> None:
        """Until each worker's log says it is ready (connected and consuming)."""
        deadline = time.monotonic() + timeout
        for proc in procs or tuple(self.procs):
            if proc.pid in self.quiet:  # logs at WARNING: raw_client's first task waits for it
                continue
            while "ready." not in self.logs[proc.pid].read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"worker {proc.args} did not start: see {self.logs[proc.pid]}"
                    )
                time.sleep(0.1)

    def dtask(
        self, concurrency: int, hostname: str | None = None, *extra: str
    ) -> subprocess.Popen[bytes]:
        name = hostname or f"bench{self.spawned + 1}@%h"
        dtask_bin = str(Path(sys.executable).with_name("dtask"))
        argv = [dtask_bin, "worker", "-c", str(concurrency), "-n", name, *extra, *WORKER_FLAGS]
        return self._spawn(argv, "dtask")

    def raw(self, concurrency: int) -> subprocess.Popen[bytes]:
        stock = os.environ.get("DTASK_BENCH_RAW") == "stock"
        flags = (
            ("--without-mingle", "--without-gossip", "--loglevel", "WARNING")
            if stock
            else (WORKER_FLAGS)
        )
        argv = [sys.executable, "-m", "celery", "-A", "bench.raw_app", "worker",
                "-c", str(concurrency), "-Q", "raw", "-n", f"raw{self.spawned + 1}@%h",
                *flags]  # fmt: skip
        proc = self._spawn(argv, "raw")
        if stock:
            self.quiet.add(proc.pid)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.procs.remove(proc)

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.procs):
            self.stop(proc)
