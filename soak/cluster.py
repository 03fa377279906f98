"""The soak's cluster: `dtask worker` and `dtask beat` subprocesses, each in its own session so
a signal reaches only what it is aimed at, replaced when a fault kills them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
DTASK = str(Path(sys.executable).with_name("dtask"))
WORKER_FLAGS = ("--without-mingle", "--without-gossip", "--loglevel", "INFO")

# Short leases so that a 2-minute soak sees many failovers (the fault tests use the same).
FAST = {
    "DTASK_LEASE_TTL": "3",
    "DTASK_HEARTBEAT_INTERVAL": "0.5",
    "DTASK_REAPER_INTERVAL": "0.5",
    "DTASK_STALL_TIMEOUT": "3",
    "DTASK_RETRY_DELAY": "0.2",
}


@dataclass
class Proc:
    role: str  # "worker" or "beat"
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pool_pids(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.pid, sig)


class Cluster:
    """Workers ``w1..wN`` (``w1`` is never killed whole: it is the RSS witness) and beats."""

    def __init__(self, env: dict[str, str], logs: Path, workers: int, beats: int) -> None:
        self.env = env
        self.logs = logs
        self.procs: list[Proc] = []
        self.spawned = 0
        self.sizes = (workers, beats)

    @property
    def home(self) -> Path:
        return Path(self.env["DTASK_HOME"])

    def start(self) -> None:
        workers, beats = self.sizes
        for _ in range(workers):
            self.spawn("worker")
        for _ in range(beats):
            self.spawn("beat")
        for proc in self.procs:
            self.wait_ready(proc)

    def spawn(self, role: str) -> Proc:
        self.spawned += 1
        name = f"{role[0]}{self.spawned}"
        log = self.logs / f"{name}.log"
        argv = [DTASK, role]
        if role == "worker":
            argv += ["-c", "2", "-n", f"{name}@%h", *WORKER_FLAGS]
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv, env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        proc = Proc(role, name, popen, log)
        self.procs.append(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 90) -> None:
        marker = " ready." if proc.role == "worker" else "beat: Starting..."
        deadline = time.monotonic() + timeout
        while marker not in proc.output():
            if not proc.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{proc.name} did not start: see {proc.log}")
            time.sleep(0.1)

    def live(self, role: str) -> list[Proc]:
        return [p for p in self.procs if p.role == role and p.alive()]

    def witness(self) -> Proc:
        return next(p for p in self.procs if p.role == "worker")

    def kill(self, proc: Proc) -> None:
        proc.signal(signal.SIGCONT)
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)

    def owner_of(self, pid: int) -> Proc | None:
        """The worker whose main or pool process has ``pid``."""
        for proc in self.live("worker"):
            if pid == proc.pid or pid in proc.pool_pids():
                return proc
        return None

    def stop(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(30)
            except subprocess.TimeoutExpired:
                proc.signal(signal.SIGKILL)
                proc.popen.wait(10)
