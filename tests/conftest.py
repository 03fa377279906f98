"""Shared fixtures: an embedded PostgreSQL + Redis under a temporary DTASK_HOME for the whole
session (no system service is used), and real `dtask worker` subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Engine

from dtask import services
from dtask.services import embedded
from tests.support import order

# Hypothesis's timing checks fail on a busy machine (the suite runs its files in parallel):
# what is tested is each example's outcome; speed lives in `make bench`.
hypothesis.settings.register_profile(
    "dtask", deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
)
hypothesis.settings.load_profile("dtask")

REPO = Path(__file__).resolve().parents[1]
DTASK = str(Path(sys.executable).with_name("dtask"))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`: `pytest -n 3 --dist loadfile`) each process gets a
    RabbitMQ vhost of its own, so two test files never share the queue `dtask`. Embedded
    PostgreSQL and Redis are per process already (each has its own DTASK_HOME)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or "DTASK_TEST_AMQP_URL" in os.environ:
        return
    vhost = f"dtask-test-{worker}"
    for argv in (["add_vhost", vhost], ["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]):
        try:
            subprocess.run(["rabbitmqctl", *argv], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return  # no rabbitmqctl: the RabbitMQ tests share the default vhost
    os.environ["DTASK_TEST_AMQP_URL"] = f"amqp://guest:guest@127.0.0.1:5672/{vhost}"


_tiers: dict[str, float] = {}  # seconds each tier's tests took (setup, call and teardown)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 else "other"
    _tiers[tier] = _tiers.get(tier, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _tiers:
        each = ", ".join(f"{tier} {seconds:.0f} s" for tier, seconds in sorted(_tiers.items()))
        terminalreporter.write_line(f"seconds per tier, summed over processes: {each}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist process: see tests/support/order.py
        order.longest_first(items)


@pytest.fixture(scope="session")
def dtask_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """DTASK_* for this session, applied to this process and handed to subprocesses."""
    home = tmp_path_factory.mktemp("home")
    sink = tmp_path_factory.mktemp("sink")
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith("DTASK_")]:
        del os.environ[name]
    os.environ.update(
        DTASK_HOME=str(home),
        DTASK_TEMPLATES="tests.support.templates",
        DTASK_TEST_SINK=str(sink),
        DTASK_RETRY_DELAY="0.2",
        DTASK_NOTIFY_ALLOW_PRIVATE="1",  # tests' webhook receivers listen on 127.0.0.1
        PYTHONPATH=str(REPO),
    )
    services.reset()
    try:
        services.store()  # start the embedded services and migrate once, up front
        _started.append(True)
        yield dict(os.environ)
    finally:
        _started.clear()
        services.reset()
        embedded.stop(home)
        os.environ.clear()
        os.environ.update(saved)


_started: list[bool] = []  # whether this process's session started the services
NOBODY_LISTENS = "redis://127.0.0.1:9/0"  # a broker URL whose sends fail at once


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every statement this process sends to PostgreSQL while the test runs."""
    sent: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(Engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", note)


@pytest.fixture
def settings_from(
    dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[dict[str, str]], None]]:
    """Set DTASK_* variables for this test and rebuild dtask's services from them; both
    undone after it."""

    def apply(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        services.reset()

    try:
        yield apply
    finally:
        monkeypatch.undo()
        services.reset()


@pytest.fixture
def no_broker(settings_from: Callable[[dict[str, str]], None]) -> None:
    """dtask's PostgreSQL as the session's, and a broker nobody listens on."""
    settings_from(
        {
            "DTASK_DATABASE_URL": services.database_url(),
            "DTASK_BROKER_URL": NOBODY_LISTENS,
            "DTASK_RESULT_BACKEND": NOBODY_LISTENS,
        }
    )


@pytest.fixture(autouse=True, scope="module")
def earlier_files_ended() -> None:
    """Each test file starts where no run of an earlier file is active and no worker of one
    is registered: on an xdist process the files share one embedded PostgreSQL, and a run
    left by another file (of a template no worker of this file knows) would take a share of
    this file's dispatch window, and a worker row left by it a share of the connection
    budget. Earlier files' runs are cancelled, as an operator would, and their workers'
    rows removed (their processes are gone: module fixtures end with their file)."""
    if not _started:
        return
    store = services.store()
    with store.engine.connect() as conn:
        active = conn.execute(
            text(
                "SELECT id FROM dtask_runs"
                " WHERE state IN ('waiting', 'pending', 'splitting', 'running')"
            )
        ).scalars()
        left = list(active)
    for run_id in left:
        store.runs.cancel(run_id)
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM dtask_workers"))


@pytest.fixture(scope="session")
def sink(dtask_env: dict[str, str]) -> Path:
    return Path(dtask_env["DTASK_TEST_SINK"])


class DtaskProcess:
    """A real `dtask ...` command in its own process group, its output in a log file."""

    ready_marker = ""

    def __init__(
        self, env: dict[str, str], log: Path, *argv: str, prefix: Sequence[str] = ()
    ) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [
                *prefix,
                DTASK,
                *argv,
            ],  # a prefix that execs its command (ip netns exec) keeps the pid
            env=env,
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready_marker in self.output():
                return
            if self.proc.poll() is not None:
                self.stop()  # its log closed: no ResourceWarning in whichever test runs next
                raise AssertionError(f"{self.log.name} exited early:\n{self.output()[-3000:]}")
            time.sleep(0.1)
        self.stop()
        tail = self.output()[-3000:]
        raise AssertionError(f"{self.log.name} not ready after {timeout} s:\n{tail}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


class WorkerProcess(DtaskProcess):
    ready_marker = " ready."

    def __init__(
        self, env: dict[str, str], log: Path, *args: str, prefix: Sequence[str] = ()
    ) -> None:
        super().__init__(
            env, log, "worker", "--without-mingle", "--without-gossip", *args, prefix=prefix
        )


class BeatProcess(DtaskProcess):
    ready_marker = "beat: Starting..."

    def __init__(self, env: dict[str, str], log: Path) -> None:
        super().__init__(env, log, "beat")


def printed_numbers(text: str) -> list[int]:
    """Numbers the sample template printed (Celery logs a child's stdout line by line)."""
    return [int(m) for m in re.findall(r"^\[[^\]]*/ForkPoolWorker-\d+\] (\d+)$", text, re.M)]


@pytest.fixture(scope="module")
def workers(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    """Two worker processes (2 pool processes each), shared by a test module."""
    with running_workers(dtask_env, tmp_path_factory.mktemp("workers"), 2, "-c", "2") as started:
        yield started


StartWorker = Callable[..., "WorkerProcess"]


@pytest.fixture
def start_worker(dtask_env: dict[str, str], tmp_path: Path) -> Iterator[StartWorker]:
    """Start a worker with these arguments and DTASK_* (``start(*args, **env)``), once it is
    ready; every one started is stopped after the test. A module may bind its own defaults
    (``functools.partial``) in a fixture of the same name."""
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        worker = WorkerProcess({**dtask_env, **env}, tmp_path / f"w{len(started)}.log", *args)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


def submitted(env: dict[str, str], template: str, **variables: object) -> int:
    """A run submitted by `dtask submit` with ``env`` (another cluster's services): its id."""
    args = [a for name, value in variables.items() for a in ("--var", f"{name}={value}")]
    done = subprocess.run(
        [DTASK, "submit", template, *args, "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["id"])


@contextlib.contextmanager
def running_workers(
    env: dict[str, str], logs: Path, count: int, *args: str
) -> Iterator[list[WorkerProcess]]:
    """``count`` workers started with ``args``, each ready; all stopped however it ends."""
    started = [WorkerProcess(env, logs / f"w{i}.log", *args) for i in range(count)]
    try:
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        for worker in started:
            worker.stop()
