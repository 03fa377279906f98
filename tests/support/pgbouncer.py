"""A real PgBouncer (Debian's, as most Django and Celery shops run it) in front of the test
session's PostgreSQL: its own port, config, log and process, stopped with the block."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.ports import free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def require() -> None:
    if not os.path.exists(BINARY):
        pytest.skip("no pgbouncer (make test installs Debian's where apt can)")


@contextmanager
def pgbouncer(
    database_url: str,
    server_connections: int = 10,
    ignore: str = "",
    clients: int = 1000,
    admin: str = "",
) -> Iterator[str]:
    """PgBouncer in transaction mode before ``database_url``'s PostgreSQL (over TCP, or a
    Unix socket folder as the embedded one's), sharing at most ``server_connections`` server
    connections among all its clients; yields the SQLAlchemy URL of the pooler. ``ignore``: its
    ``ignore_startup_parameters`` (``options`` makes it drop dtask's silently); ``clients``
    its ``max_client_conn``; ``admin`` a user its admin console (``SHOW CONFIG``) lets in."""
    require()
    target = make_url(database_url)
    socket_dir = target.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else target.host
    port = free_port()
    # its own folder, reachable by the user it runs as (pytest's folders are the runner's only)
    folder = Path(tempfile.mkdtemp(prefix="dtask-pgbouncer-"))
    folder.chmod(0o755)
    config = folder / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={host} port={target.port or 5432} user={target.username}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = any\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {server_connections}\n"
        f"max_client_conn = {clients}\n"
        f"admin_users = {admin}\n"
        "server_reset_query =\n"
        f"ignore_startup_parameters = {ignore or 'extra_float_digits'}\n"
        f"logfile = {folder / 'pgbouncer.log'}\n"
        f"pidfile = {folder / 'pgbouncer.pid'}\n"
    )
    argv = [BINARY, str(config)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: as the PostgreSQL's own user
        owner = (
            pwd.getpwuid(os.stat(socket_dir).st_uid).pw_name
            if isinstance(socket_dir, str)
            else "postgres"
        )
        shutil.chown(folder, owner)
        shutil.chown(config, owner)
        argv += ["-u", owner]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = folder / "pgbouncer.log"
                    raise AssertionError(
                        f"pgbouncer did not start: {log.read_text() if log.exists() else ''}"
                    ) from None
                time.sleep(0.1)
        yield f"postgresql+psycopg://{target.username}@127.0.0.1:{port}/{target.database}"
    finally:
        process.send_signal(signal.SIGINT)  # SIGINT: at once, whatever the clients do
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
