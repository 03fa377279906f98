"""PostgreSQL with a streaming replica for the failover tests: two clusters of the bundled
PostgreSQL (pgserver's binaries, run as its system user when the tests run as root), a primary
and a standby made by `pg_basebackup -R`, on free ports of 127.0.0.1, in a folder of the
test's own. ``synchronous`` makes every commit wait for the standby."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from dtask.services.embedded import _quiet_import_pgserver
from tests.support.db import wait_for
from tests.support.ports import free_port


def _bin() -> Path:
    _quiet_import_pgserver()
    import pgserver._commands  # type: ignore[import-untyped]

    return Path(pgserver._commands.POSTGRES_BIN_PATH)


def _user() -> str | None:
    """Who runs the servers: PostgreSQL refuses root (pgserver's own user, as the embedded
    one is run)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("pgserver")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "pgserver"], check=True)
    return "pgserver"


@dataclass
class Cluster:
    name: str
    data: Path
    port: int

    @property
    def conninfo(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=2"

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.conninfo) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def in_recovery(self) -> bool:
        with psycopg.connect(self.conninfo) as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])


@dataclass
class Replicated:
    folder: Path
    primary: Cluster
    standby: Cluster
    lagging: bool = False  # what the test makes of it

    @property
    def url(self) -> str:
        """Both hosts, libpq picking the one that takes writes."""
        return (
            "postgresql+psycopg://postgres@/postgres?host=127.0.0.1:"
            f"{self.primary.port}&host=127.0.0.1:{self.standby.port}"
            "&target_session_attrs=read-write"
        )

    @property
    def conninfo(self) -> str:
        """The same for psycopg: whichever host takes writes."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port}"
            " user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2"
        )

    def ctl(self, cluster: Cluster, *args: str) -> None:
        run([str(_bin() / "pg_ctl"), "-D", str(cluster.data), *args])

    def sender(self) -> int:
        """The primary's WAL sender process (stopped, it sends the standby nothing more)."""
        with psycopg.connect(self.primary.conninfo) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_replication").fetchone()
        assert row is not None, "the primary sends no WAL"
        return int(row[0])

    def kill_primary(self) -> None:
        """A crash: the primary's every process SIGKILLed at once; what it had not sent is
        gone."""
        postmaster = psutil.Process(
            int((self.primary.data / "postmaster.pid").read_text().split()[0])
        )
        for proc in [postmaster, *postmaster.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs([postmaster], timeout=30)

    def promote(self) -> None:
        self.ctl(self.standby, "-w", "promote")
        wait_for(lambda: not self.standby.in_recovery(), 30, "the standby to take writes")

    def stop(self) -> None:
        for cluster in (self.primary, self.standby):
            if (cluster.data / "postmaster.pid").exists() and cluster.answers():
                subprocess.run(
                    [str(_bin() / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "stop"],
                    user=_user(), capture_output=True, check=False, timeout=60,
                )  # fmt: skip


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, user=_user(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stderr}"


def own_folder(folder: Path) -> None:
    """``folder`` made (if need be) and given to the user the servers run as, with the way
    to it open to that user (the test's folders are root's, 0700)."""
    folder.mkdir(parents=True, exist_ok=True)
    user = _user()
    if user is not None:
        _bin()
        from pgserver.utils import ensure_prefix_permissions  # type: ignore[import-untyped]

        ensure_prefix_permissions(folder)
        shutil.chown(folder, user)


@contextmanager
def replicated(folder: Path, synchronous: bool) -> Iterator[Replicated]:
    """A primary and its streaming standby, started; both stopped at the end."""
    own_folder(folder)
    primary = Cluster("primary", folder / "primary", free_port())
    standby = Cluster("standby", folder / "standby", free_port())
    found = Replicated(folder, primary, standby)
    try:
        run([str(_bin() / "initdb"), "-D", str(primary.data), "--auth=trust", "-U", "postgres"])
        settings = [
            f"port = {primary.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{folder}'",
            "wal_level = replica",
            "max_wal_senders = 5",
            "hot_standby = on",
            "max_connections = 100",
        ]
        if synchronous:
            settings.append("synchronous_standby_names = '*'")
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(settings) + "\n")
        start(found, primary)
        run([
            str(_bin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(standby.data), "-R", "-X", "stream",
        ])  # fmt: skip
        with (standby.data / "postgresql.conf").open("a") as conf:
            # promoted, it has no standby of its own: naming one would hold every commit
            conf.write(f"port = {standby.port}\nsynchronous_standby_names = ''\n")
        start(found, standby)
        wait_for(lambda: standby.in_recovery(), 30, "the standby to replay")
        yield found
    finally:
        found.stop()


def start(found: Replicated, cluster: Cluster) -> None:
    log = found.folder / f"{cluster.name}.log"
    found.ctl(cluster, "-w", "-l", str(log), "start")
    wait_for(cluster.answers, 60, f"the {cluster.name} to answer on {cluster.port}")
