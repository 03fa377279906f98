"""A private PostgreSQL for the cluster benchmark, from the machine's own binaries (Debian's
``postgresql``): stock ``max_connections = 100``, with ``pg_stat_statements`` so that what each
of dtask's loops costs can be read per statement. Its own folder and port; stopped at exit."""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise SystemExit(
            "make cluster needs PostgreSQL's server binaries (Debian: apt-get install postgresql)"
        )
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(max_connections: int = 100) -> str:
    """Start it; its SQLAlchemy URL (TCP on 127.0.0.1, trust)."""
    bin_dir = binaries()
    folder = Path(tempfile.mkdtemp(prefix="dtask-cluster-pg-"))
    folder.chmod(0o755)
    data = folder / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        owner = "postgres"
        pwd.getpwnam(owner)
        shutil.chown(folder, owner)
        as_user = ["runuser", "-u", owner, "--"]
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
         "--no-sync"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = folder / "postgres.log"
    server = subprocess.Popen(
        [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
         "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={folder}",
         "-c", f"max_connections={max_connections}",
         "-c", "shared_preload_libraries=pg_stat_statements",
         "-c", "pg_stat_statements.track=all", "-c", f"log_directory={folder}",
         "-c", "logging_collector=off"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True,
    )  # fmt: skip

    def stop() -> None:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            ready = subprocess.run(
                [str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the cluster's PostgreSQL did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return url
