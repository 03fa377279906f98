"""A local stack: the services, N workers, beat and Flower as child processes, stopped together.

Used by `dtask up` and `make demo`. Every child runs in its own session so a terminal's Ctrl-C
reaches only us; we then stop them in order (SIGTERM, then SIGKILL after a grace period) and
the embedded PostgreSQL and Redis last, leaving no process behind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dtask import services
from dtask.exceptions import ConfigurationError, DtaskError, Invalid
from dtask.local import supervisor
from dtask.local.supervisor import Backoff, exited, last_error, rotate
from dtask.services import embedded
from dtask.services.extras import require
from dtask.settings import Settings, load, mask

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
WATCH_INTERVAL = 1.0  # seconds between checks that the embedded services still run


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    command: list[str] = field(default_factory=list)
    since: int = 0  # where this process's output starts in its log (logs are appended to)
    started: float = field(default_factory=time.monotonic)
    backoff: Backoff = field(default_factory=Backoff)
    restart_at: float | None = None  # once it exited: when it is started again

    def output(self) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(self.since)
            return log.read().decode(errors="replace")


def dtask_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dtask.cli", *args]


FLOWER_USER = "dtask"


def flower_auth(address: str) -> str:
    """Flower's user:password: DTASK_FLOWER_AUTH, required beyond loopback; on loopback
    without it, one generated once and kept in the state folder (mode 0600), because Flower
    without a password answers (and obeys) any web page the operator's browser visits."""
    settings = load()
    if settings.flower_auth is not None:
        return settings.flower_auth.get_secret_value()
    if address not in LOOPBACK:
        raise ConfigurationError(
            f"Flower would listen on {address} without a password: set DTASK_FLOWER_AUTH=user:pw"
        )
    return f"{FLOWER_USER}:{local_flower_password(settings.home)}"


def flower_password_file(home: Path) -> Path:
    return home / "flower-password"


def local_flower_password(home: Path) -> str:
    """The local Flower's password: made once (the first of two processes starting at once
    wins, atomically: the file is never seen empty), readable by this user only."""
    path = flower_password_file(home)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        made = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(18) + "\n")
        try:
            os.link(made, path)
        except FileExistsError:
            pass  # another process made it first: theirs is the password
        finally:
            made.unlink()
    os.chmod(path, 0o600)
    password = path.read_text().strip()
    if not password:
        raise ConfigurationError(f"{path} is empty: remove it, and a new password is made")
    return password


def flower_login(home: Path) -> str:
    """How to log in to the local Flower, said without the password itself."""
    if load().flower_auth is not None:
        return "user and password from DTASK_FLOWER_AUTH"
    return f"user {FLOWER_USER}, password: `cat {flower_password_file(home)}`"


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise DtaskError(f"no free TCP port (wanted {preferred})")


@dataclass
class Stack:
    workers: int = 2
    concurrency: int = 1
    flower: bool = True
    beat: bool = True
    flower_port: int = 5555
    flower_address: str = "127.0.0.1"
    api: bool = True
    api_port: int = 8000
    children: list[Child] = field(default_factory=list)
    settings: Settings | None = None
    report: Callable[[str], None] = print
    _stopping: threading.Event = field(default_factory=threading.Event)
    _watcher: threading.Thread | None = None

    @property
    def logs(self) -> Path:
        assert self.settings is not None
        return self.settings.home / "logs"

    @property
    def flower_url(self) -> str:
        host = "127.0.0.1" if self.flower_address in ("0.0.0.0", "::") else self.flower_address
        return f"http://{host}:{self.flower_port}/"

    def start(self) -> None:
        if self.flower and self.api and self.flower_port == self.api_port:
            raise Invalid(
                f"--flower-port and --api-port are both {self.api_port}: give them different ports"
            )
        if self.flower:
            require("flower", "flower", "Flower (or start without it: dtask up --no-flower)")
        if self.api:
            require("fastapi", "api", "the dashboard (or start without it: dtask up --no-api)")
        resolved = services.ensure_broker()  # a mixed configuration is refused first
        self.settings = resolved.settings
        services.store()  # migrated before anything runs
        if self.flower:
            flower_auth(self.flower_address)
            self.flower_port = free_port(self.flower_port)
        if self.api:
            self.api_port = free_port(self.api_port)
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.settings.embedded_database or self.settings.embedded_broker:
            self._watcher = threading.Thread(
                target=self._watch_services, name="dtask service watch", daemon=True
            )
            self._watcher.start()
        for i in range(1, self.workers + 1):
            self.start_worker(i)
        if self.beat:
            self._spawn("beat", dtask_command("beat"))
        if self.flower:
            self._spawn(
                "flower",
                dtask_command(
                    "flower", "--port", str(self.flower_port), "--address", self.flower_address
                ),
            )
        if self.api:
            self._spawn("api", dtask_command("serve", "--port", str(self.api_port)))

    def _watch_services(self) -> None:
        """Restart an embedded service that died: nothing else would until the next command."""
        assert self.settings is not None
        home = self.settings.home
        postgres, redis = self.settings.embedded_database, self.settings.embedded_broker
        while not self._stopping.wait(WATCH_INTERVAL):
            try:
                revived = embedded.revive(home, postgres=postgres, redis=redis)
            except DtaskError as exc:
                self.report(f"dtask: an embedded service is down and did not restart: {exc}")
                continue
            for name in revived:
                self.report(f"dtask: the embedded {name} had stopped; restarted it")

    def start_worker(self, number: int) -> Child:
        return self._spawn(
            f"worker-{number}",
            dtask_command(
                "worker", "-c", str(self.concurrency), "--hostname", f"worker-{number}@%h",
                "--without-mingle", "--without-gossip",
            ),
        )  # fmt: skip

    def reload(self) -> None:
        """Restart every process that imports templates (workers hand their children over,
        as on scale-down), so edited template code takes effect; Flower stays."""
        old = [c for c in self.children if c.name != "flower"]
        for child in old:
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                os.killpg(child.proc.pid, signal.SIGTERM)
        for child in old:
            try:
                child.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(10)
            self.children.remove(child)
        for child in old:
            self._spawn(child.name, child.command)
        self.wait_ready()

    def _spawn(self, name: str, command: list[str], backoff: Backoff | None = None) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:  # appended to (a restart empties no log), rotated at a size
            since = out.tell()
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=supervisor.ends_with_its_parent,
            )
        child = Child(name, proc, log, command, since, backoff=backoff or Backoff())
        self.children.append(child)
        return child

    def supervise(self) -> None:
        """One look after the processes (`dtask up` takes one a second): one that exited is
        said in a line and started again after its backoff; a log past its size is rotated."""
        now = time.monotonic()
        for child in list(self.children):
            if rotate(child.log):
                child.since = 0
            if child.proc.poll() is None:
                continue
            if child.restart_at is None:
                code, uptime = child.proc.returncode, now - child.started
                said, delay = exited(
                    child.name, code, uptime, child.output(), child.log, child.backoff
                )
                child.restart_at = now + delay
                self.report(said)
            elif now >= child.restart_at:
                self.children.remove(child)
                again = self._spawn(child.name, child.command, child.backoff)
                self.report(f"dtask up: {child.name} started again (pid {again.proc.pid})")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for child in self.children:
            while not self._ready(child):
                if child.proc.poll() is not None:
                    error = last_error(child.output())[:300]
                    raise DtaskError(f"{child.name} exited at start: {error} (see {child.log})")
                if time.monotonic() > deadline:
                    raise DtaskError(
                        f"{child.name} not ready after {timeout:g} s (see {child.log})"
                    )
                time.sleep(0.1)

    def _ready(self, child: Child) -> bool:
        if child.name.startswith("worker"):
            return " ready." in child.output()
        if child.name == "flower":
            try:
                urllib.request.urlopen(self.flower_url + "healthcheck", timeout=1).close()
            except urllib.error.HTTPError as exc:
                exc.close()
                return True  # answering (with auth required) is ready
            except OSError:
                return False
            return True
        if child.name == "api":
            return "Uvicorn running on" in child.output()
        return True

    def describe(self) -> list[str]:
        assert self.settings is not None
        resolved = services.current()
        lines = [
            f"database  {mask(resolved.database_url)}",
            f"broker    {mask(resolved.broker_url)}",
            f"workers   {self.workers} x {self.concurrency} process(es)"
            + ("" if not self.beat else ", beat"),
            f"logs      {self.logs}",
        ]
        if self.api:
            lines[0:0] = [
                f"dashboard http://127.0.0.1:{self.api_port}/ (log in with a token: `dtask token"
                " create --client default --admin`)",
                f"api       http://127.0.0.1:{self.api_port}/api/v1",
            ]
        if self.flower:
            flower_auth("127.0.0.1")  # the password exists before anyone reads how to log in
            lines.insert(0, f"flower    {self.flower_url} ({flower_login(load().home)})")
        return lines

    def kill(self, child: Child, sig: signal.Signals = signal.SIGKILL) -> None:
        os.killpg(child.proc.pid, sig)
        child.proc.wait(20)

    def stop(self, grace: float = 20) -> None:
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        for child in self.children:
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait(10)
            with contextlib.suppress(ProcessLookupError):  # pool processes of a killed worker
                os.killpg(child.proc.pid, signal.SIGKILL)
        if self.settings is not None and self.settings.embedded_database:
            embedded.stop(self.settings.home)
