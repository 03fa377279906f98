"""Redis with Sentinel for the failover tests: a primary, a replica and three sentinels, each a
real `redis-server` (Debian's; `--sentinel` makes one a sentinel) on a free port of 127.0.0.1,
in a folder of the test's own. The sentinels notice a dead primary within ``DOWN_AFTER`` ms."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.db import wait_for
from tests.support.ports import free_port

MASTER = "dtask-test"
DOWN_AFTER = 1000  # ms without an answer before a sentinel says the primary is down


@dataclass
class SentinelSet:
    folder: Path
    ports: dict[str, int] = field(default_factory=dict)  # primary, replica, s0, s1, s2
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """Celery's Sentinel URL, every sentinel in it."""
        return ";".join(f"sentinel://127.0.0.1:{self.ports[f's{i}']}/0" for i in range(3))

    def start(self, name: str, *args: str) -> None:
        port = self.ports.setdefault(name, free_port())
        log = (self.folder / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [
                "redis-server", *args, "--port", str(port), "--bind", "127.0.0.1",
                "--dir", str(self.folder), "--dbfilename", f"{name}.rdb", "--save", "",
                "--appendonly", "no",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        wait_for(lambda: _pings(port), 30, f"{name} to answer on {port}")

    def client(self, name: str) -> redis.Redis:
        return redis.Redis(port=self.ports[name], socket_timeout=2, socket_connect_timeout=2)

    def master_port(self) -> int | None:
        """The primary's port as the first sentinel that answers says it."""
        for i in range(3):
            try:
                found = self.client(f"s{i}").sentinel_get_master_addr_by_name(MASTER)
            except redis.RedisError:
                continue
            if isinstance(found, tuple):
                return int(found[1])
        return None

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def freeze(self, name: str) -> None:
        """SIGSTOP: the kernel still accepts its connections, nothing answers them."""
        self.procs[name].send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


@contextmanager
def sentinels(folder: Path) -> Iterator[SentinelSet]:
    """A primary, its replica, three sentinels watching them; all killed at the end."""
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (apt install redis-server)")
    found = SentinelSet(folder)
    try:
        found.start("primary")
        primary = found.ports["primary"]
        found.start("replica", "--replicaof", "127.0.0.1", str(primary))
        wait_for(lambda: _linked(found.client("replica")), 30, "the replica to sync")
        for i in range(3):
            conf = folder / f"s{i}.conf"  # a sentinel rewrites its file: one each, writable
            conf.write_text(
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER}\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            found.start(f"s{i}", str(conf), "--sentinel")
        wait_for(lambda: found.master_port() == primary, 30, "the sentinels to see it")
        yield found
    finally:
        found.stop()


def _pings(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _linked(replica: redis.Redis) -> bool:
    info = replica.info("replication")
    return info.get("master_link_status") == "up"
