"""The Django-shaped project (tests/django_project) as a team runs it: its environment (PROJ_*
services, no DTASK_* variable), `manage.py` commands and plain `celery -A proj ...` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dtask import services
from dtask.services import embedded
from tests.conftest import REPO
from tests.support.db import wait_for

PROJECT = REPO / "tests" / "django_project"


def django_env(dtask_env: dict[str, str], vhost: int) -> dict[str, str]:
    """The project's settings come from PROJ_*: the session's embedded PostgreSQL (the same
    database as dtask's, as most teams run it) and Redis on a database number of its own."""
    services.ensure_broker()
    broker = f"{embedded.redis_url(Path(dtask_env['DTASK_HOME']))}?virtual_host={vhost}"
    env = {k: v for k, v in dtask_env.items() if not k.startswith("DTASK_")}
    return {
        **env,
        "PYTHONPATH": f"{PROJECT}{os.pathsep}{REPO}",
        "DJANGO_SETTINGS_MODULE": "proj.settings",
        "PROJ_BROKER_URL": broker,
        "PROJ_DATABASE_URL": services.database_url(),
    }


def manage(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip


def python(
    env: dict[str, str], code: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Python in the project (as its web process or a shell would run it)."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def celery(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`celery -A proj ...` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "proj", *args], cwd=PROJECT, env=env,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


class Celery:
    """A long-running `celery -A proj ...` (a worker, a beat) in its own process group."""

    def __init__(self, env: dict[str, str], log: Path, *args: str, ready: str = " ready.") -> None:
        self.log = log
        self.ready = ready
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", *args],
            cwd=PROJECT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90) -> Celery:
        wait_for(
            lambda: self.ready in self.output() or self.proc.poll() is not None, timeout, "ready"
        )
        assert self.proc.poll() is None, self.output()[-3000:]
        return self

    def terminate(self) -> None:
        """SIGTERM to the main process only, as Kubernetes and `docker stop` send it."""
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()
