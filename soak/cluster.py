"""The soak's cluster: `dtask worker` and `dtask beat` subprocesses, each in its own session so
a signal reaches only what it is aimed at, replaced when a fault kills them. Where network
namespaces can be made, every worker but the witness runs in one of its own, reaching
PostgreSQL and Redis through relays on two links that a fault can cut (soak/netns.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from sqlalchemy.engine import make_url

from dtask import services
from dtask.services import embedded
from soak import netns

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
    net: Wired | None = None

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


@dataclass
class Wired:
    """A worker's namespace and the relays behind its links ``db`` and ``mq``."""

    partition: netns.Partition
    relays: list[netns.Relay]

    def close(self) -> None:
        self.partition.heal()
        for relay in self.relays:
            relay.close()
        self.partition.delete()


def wire(env: dict[str, str]) -> tuple[Wired, dict[str, str]]:
    """A new namespace whose links lead to the embedded PostgreSQL and Redis, and the
    environment of a worker that reaches them only through it."""
    url = make_url(services.database_url())
    pg_socket = f"{url.query['host']}/.s.PGSQL.{url.port or 5432}"
    redis_socket = str(embedded.redis_socket(Path(env["DTASK_HOME"])))
    partition = netns.Partition.create("db", "mq")
    try:
        db, mq = partition.links["db"], partition.links["mq"]
        relays = [netns.Relay(db.host, pg_socket), netns.Relay(mq.host, redis_socket)]
    except BaseException:
        partition.delete()
        raise
    redis_url = f"redis://{mq.host}:{relays[1].port}/0"
    inside = {
        **env,
        "DTASK_NETWORK_TIMEOUT": "3",
        "DTASK_DATABASE_URL": f"postgresql+psycopg://{url.username}@{db.host}:{relays[0].port}"
        f"/{url.database}",
        "DTASK_BROKER_URL": redis_url,
        "DTASK_RESULT_BACKEND": redis_url,
    }
    return Wired(partition, relays), inside


class Cluster:
    """Workers ``w1..wN`` (``w1`` is never killed whole: it is the RSS witness) and beats.
    With ``partitioned``, every worker but ``w1`` runs in a network namespace of its own."""

    def __init__(
        self, env: dict[str, str], logs: Path, workers: int, beats: int, partitioned: bool = False
    ) -> None:
        self.env = env
        self.logs = logs
        self.procs: list[Proc] = []
        self.spawned = 0
        self.sizes = (workers, beats)
        self.partitioned = partitioned

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
        for dead in [p for p in self.procs if p.net is not None and not p.alive()]:
            self._unwire(dead)
        self.spawned += 1
        name = f"{role[0]}{self.spawned}"
        log = self.logs / f"{name}.log"
        argv, env, net = [DTASK, role], self.env, None
        if role == "worker":
            argv += ["-c", "2", "-n", f"{name}@%h", *WORKER_FLAGS]
            if self.partitioned and any(p.role == "worker" for p in self.procs):
                net, env = wire(self.env)
                argv = net.partition.command(*argv)  # it execs: the pid stays the worker's
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        proc = Proc(role, name, popen, log, net=net)
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

    def wired(self) -> list[Proc]:
        """Live workers whose links a fault can cut."""
        return [p for p in self.live("worker") if p.net is not None]

    def kill(self, proc: Proc) -> None:
        proc.signal(signal.SIGCONT)
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)
        self._unwire(proc)

    def _unwire(self, proc: Proc) -> None:
        if proc.net is not None:
            proc.net.close()
            proc.net = None

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
            self._unwire(proc)
