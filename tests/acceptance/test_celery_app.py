"""dtask inside a team's own Celery app (tests/celery_project): `dtask.init_app(app)` and then
`celery -A proj worker` as real processes, no DTASK_* variable set. The host's own task keeps
working; a dtask template runs from `.delay()`; completion does not depend on the result
backend (Redis, or Celery's database backend); SIGKILL and SIGTERM behave as under
`dtask worker`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
from sqlalchemy import text

from dtask import services
from dtask.db import schema
from dtask.domain.runs import RunState
from dtask.services import embedded
from tests.conftest import REPO
from tests.support.db import child_row, owner_pid, wait_for

pytestmark = pytest.mark.acceptance
PROJECT = REPO / "tests" / "celery_project"


class CeleryWorker:
    """`celery -A proj worker` in its own process group."""

    def __init__(self, env: dict[str, str], log: Path, *args: str) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", "worker", "-l", "INFO",
             "--without-mingle", "--without-gossip", *args],
            cwd=PROJECT, env=env, stdout=self._out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> CeleryWorker:
        wait_for(lambda: " ready." in self.output() or self.proc.poll() is not None, 90, "ready")
        assert self.proc.poll() is None, self.output()[-3000:]
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


def project_env(
    dtask_env: dict[str, str], sink: Path, backend: str | None, vhost: int
) -> dict[str, str]:
    """The project's own settings (PROJ_*); no DTASK_* variable at all."""
    services.ensure_broker()  # the session's embedded Redis, on a database number of its own
    broker = f"{embedded.redis_url(Path(dtask_env['DTASK_HOME']))}?virtual_host={vhost}"
    env = {k: v for k, v in dtask_env.items() if not k.startswith("DTASK_")}
    return {
        **env,
        "PYTHONPATH": f"{PROJECT}{os.pathsep}{REPO}",
        "PROJ_BROKER_URL": broker,
        "PROJ_RESULT_BACKEND": backend or broker,
        "PROJ_DATABASE_URL": services.database_url(),
        "PROJ_SINK": str(sink),
    }


def in_project(env: dict[str, str], code: str) -> str:
    """Run Python in the project's environment (as its web app would) and return stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def delay(env: dict[str, str], n: int, seconds: float) -> int:
    """``proj_range.delay(...)`` in the project's environment: the new run's id."""
    code = f"from proj.tasks import proj_range; print(proj_range.delay(n={n}, delay={seconds}).id)"
    return int(in_project(env, code))


def finished(run_id: int) -> bool:
    return services.store().runs.status(run_id).state.finished


def numbers(sink: Path, run_id: int) -> list[int]:
    return [
        int(line.split()[0])
        for path in sink.glob(f"{run_id}-*.txt")
        for line in path.read_text().splitlines()
    ]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., CeleryWorker]]:
    started: list[CeleryWorker] = []

    def start_worker(env: dict[str, str], *args: str) -> CeleryWorker:
        worker = CeleryWorker(env, tmp_path / f"w{len(started)}.log", *args)
        started.append(worker)
        return worker.wait_ready()

    yield start_worker
    for worker in started:
        worker.stop()


def _database_backend() -> str:
    return "db+" + services.database_url()


@pytest.mark.parametrize("backend", ["redis", "database"])
def test_a_host_worker_runs_its_own_task_and_a_dtask_run_from_delay(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path, backend: str
) -> None:
    env = project_env(
        dtask_env, tmp_path, _database_backend() if backend == "database" else None, 9
    )
    worker = start(env, "-Q", "celery,dtask", "-c", "2")
    code = "from proj.tasks import add; print(add.delay(2, 3).get(timeout=60))"
    assert in_project(env, code) == "5"
    run_id = delay(env, 200, 0)
    wait_for(lambda: finished(run_id), 120, f"run {run_id} to finish")
    status = services.store().runs.status(run_id)
    assert status.state is RunState.SUCCEEDED, status.error
    assert sorted(numbers(tmp_path, run_id)) == list(range(1, 201))
    with services.store().engine.connect() as conn:
        lag = conn.execute(
            text(
                "SELECT extract(epoch FROM r.finished_at - max(c.finished_at)) FROM dtask_runs r"
                " JOIN dtask_children c ON c.run_id = r.id WHERE r.id = :r GROUP BY r.id"
            ),
            {"r": run_id},
        ).scalar()
    print(f"\n[{backend}] run finalized {lag:.3f} s after its last child finished")
    assert lag < 1.0
    assert "finalized by its last child" in worker.output()
    assert "Received unregistered task" not in worker.output()


def test_a_host_app_prefetching_more_than_one_is_refused_in_one_line(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 9)
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "proj", "worker", "--prefetch-multiplier", "4"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert "dtask: worker_prefetch_multiplier is 4; dtask's children need 1" in result.stderr


def test_sigkill_of_a_host_worker_resumes_its_children_on_another(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 10)
    # both up before the run: a worker started after the first child checkpointed could
    # outlast the child on a slow machine, leaving nothing to resume
    workers = [start(env, "-Q", "celery,dtask", "-c", "2", "-n", f"{n}@%h") for n in "ab"]
    run_id = delay(env, 40, 0.25)  # 2 children of 5 s each
    wait_for(
        lambda: (child_row(run_id, 0).checkpoint or {}).get("done", 0) >= 5, 60, "a checkpoint"
    )
    owner = os.getpgid(owner_pid(child_row(run_id, 0).owner or ""))
    first = next(w for w in workers if w.proc.pid == owner)
    second = next(w for w in workers if w is not first)
    killed = time.monotonic()
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(10)
    wait_for(
        lambda: (
            (row := child_row(run_id, 0)).owner is not None
            and row.attempt == 2
            and os.getpgid(owner_pid(row.owner)) == second.proc.pid
        ),
        60,
        "child 0 to resume on the second worker",
    )
    resumed = time.monotonic() - killed
    print(f"\nchild 0 resumed on the other host worker {resumed:.1f} s after SIGKILL")
    wait_for(lambda: finished(run_id), 120, "the run to finish")
    assert services.store().runs.status(run_id).state is RunState.SUCCEEDED
    seen = numbers(tmp_path, run_id)
    assert set(seen) == set(range(1, 41))
    assert len(seen) - len(set(seen)) <= 2 * 5  # at most one checkpoint interval per child


def test_sigterm_of_a_host_worker_hands_its_children_over(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 11)
    leaving = start(env, "-Q", "celery,dtask", "-c", "2", "-n", "leaving@%h")
    run_id = delay(env, 40, 0.6)  # two children of 12 s: still running once `staying` is up
    for index in (0, 1):
        wait_for(lambda i=index: (child_row(run_id, i).checkpoint or {}).get("done", 0) >= 5,
                 60, f"child {index} to checkpoint")  # fmt: skip
    staying = start(env, "-Q", "celery,dtask", "-c", "2", "-n", "staying@%h")
    assert [child_row(run_id, i).state for i in (0, 1)] == ["running", "running"]
    sent = time.monotonic()
    os.killpg(leaving.proc.pid, signal.SIGTERM)
    assert leaving.proc.wait(30) == 0
    print(f"\nhost worker exited {time.monotonic() - sent:.2f} s after SIGTERM")
    assert time.monotonic() - sent < 15
    wait_for(lambda: finished(run_id), 120, "the run to finish")
    assert services.store().runs.status(run_id).state is RunState.SUCCEEDED
    seen = numbers(tmp_path, run_id)
    assert sorted(seen) == list(range(1, 41))  # handed over at a checkpoint: nothing redone
    assert "stopped at its checkpoint and was released" in leaving.output()
    assert staying.proc.poll() is None


CELERY_CALLS = """
import time, datetime, json
import dtask
from proj.tasks import proj_range

out = {}
later = proj_range.apply_async(kwargs={"n": 20, "delay": 0}, countdown=2, priority=8)
out["pending_at_1s"] = (time.sleep(1), later.state.value)[1]
out["later"] = later.get(timeout=60)
out["later_ok"] = later.successful() and later.ready() and not later.failed()
out["later_id"] = later.id
run_id = proj_range.si(n=30, delay=0).delay().get(timeout=60)  # dtask.submit's result
out["si"] = dtask.get_run(run_id).get(timeout=60)
out["si_id"] = run_id
stopped = proj_range.apply_async(kwargs={"n": 40, "delay": 0.25})
stopped.revoke()
try:
    stopped.get(timeout=60)
except dtask.RunCancelled as exc:
    out["revoked"] = str(exc)
out["revoked_state"] = stopped.state.value
stopped.revoke()  # a finished run: nothing to do
for bad in (dict(args=(1,)), dict(countdown=-1), dict(countdown=1, eta=datetime.datetime.now())):
    try:
        proj_range.apply_async(kwargs={"n": 5, "delay": 0}, **bad)
    except dtask.DtaskError as exc:
        out.setdefault("refused", []).append(str(exc))
print(json.dumps(out))
"""


def test_celery_shaped_calls_from_the_host_application(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 12)
    start(env, "-Q", "celery,dtask", "-c", "2")
    out = json.loads(in_project(env, CELERY_CALLS))
    assert out["pending_at_1s"] == "pending"  # countdown=2 holds the start back
    assert out["later"] is None and out["later_ok"] is True
    assert sorted(numbers(tmp_path, out["later_id"])) == list(range(1, 21))
    assert out["si"] is None and sorted(numbers(tmp_path, out["si_id"])) == list(range(1, 31))
    assert out["revoked"].endswith("was cancelled") and out["revoked_state"] == "cancelled"
    assert len(out["refused"]) == 3, out["refused"]
    assert "takes named variables" in out["refused"][0]
    assert "countdown must be 0 to" in out["refused"][1]
    assert "give countdown or eta, not both" in out["refused"][2]
    with services.store().engine.connect() as conn:
        waited = conn.execute(
            text(
                "SELECT extract(epoch FROM min(c.started_at) - r.created_at) FROM dtask_runs r"
                " JOIN dtask_children c ON c.run_id = r.id WHERE r.id = :r GROUP BY r.id"
            ),
            {"r": out["later_id"]},
        ).scalar()
    print(f"\ncountdown=2: first child claimed {waited:.2f} s after submit")
    assert waited >= 2


def test_the_hosts_beat_schedule_starts_dtask_runs_beside_its_own_task(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 13)
    start(env, "-Q", "celery,dtask", "-c", "2")
    with services.store().engine.connect() as conn:
        before = conn.execute(text("SELECT coalesce(max(id), 0) FROM dtask_runs")).scalar()
    log = (tmp_path / "beat.log").open("wb")
    beat = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "proj", "beat", "-l", "INFO",
         "-s", str(tmp_path / "celerybeat-schedule")],
        cwd=PROJECT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:

        def beat_runs() -> list[tuple[int, str]]:
            with services.store().engine.connect() as conn:
                return [
                    (int(r.id), str(r.state))
                    for r in conn.execute(
                        text(
                            "SELECT id, state FROM dtask_runs WHERE id > :b"
                            " AND template = 'proj_range' AND variables->>'n' = '20'"
                        ),
                        {"b": before},
                    )
                ]

        wait_for(
            lambda: len([r for r in beat_runs() if r[1] == "succeeded"]) >= 2, 90, "two beat runs"
        )
        wait_for(lambda: (tmp_path / "add.txt").exists(), 30, "the host's own task")
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(30)
        log.close()
    for run_id, _ in beat_runs():
        wait_for(lambda r=run_id: finished(r), 60, f"run {run_id} to finish")
    assert set((tmp_path / "add.txt").read_text().split()) == {"5"}


SCHEDULER = "dtask.worker.beat:DatabaseScheduler"
SENDING_ADD = "Sending due task add-every-second"


def test_one_beat_for_both_kinds_two_beats_send_the_apps_entries_once(
    start: Callable[..., CeleryWorker], dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """`celery -A proj beat -S dtask...` runs dtask's schedules and the app's own entries;
    with two such beats only the lease holder sends the app's entries, and when it is killed
    the other takes over."""
    env = project_env(dtask_env, tmp_path, None, 14)
    start(env, "-Q", "celery,dtask", "-c", "2")
    beats: list[tuple[subprocess.Popen[bytes], BinaryIO]] = []

    def start_beat(name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.log"
        out = log.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", "beat", "-l", "INFO", "-S", SCHEDULER],
            cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        beats.append((proc, out))
        return proc, log

    try:
        first, first_log = start_beat("first")
        wait_for(lambda: SENDING_ADD in first_log.read_text(), 60, "the first beat to send")
        _, second_log = start_beat("second")
        wait_for(lambda: "beat: Starting" in second_log.read_text(), 60, "the second beat")
        sent_before = first_log.read_text().count(SENDING_ADD)
        wait_for(lambda: first_log.read_text().count(SENDING_ADD) >= sent_before + 5, 60, "5 sends")
        assert SENDING_ADD not in second_log.read_text()  # both ran; one sent
        killed = time.monotonic()
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: SENDING_ADD in second_log.read_text(), 60, "the second beat to take over")
        took = time.monotonic() - killed
        print(f"\nthe second beat sent the app's entries {took:.1f} s after the first was killed")
        assert took < 30  # the lease (15 s) runs out, then the next pass takes it
        wait_for(lambda: (tmp_path / "add.txt").exists(), 30, "the host's own task ran")
    finally:
        for proc, out in beats:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:  # seen once under load: never leak it
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            out.close()


def test_celery_dtask_commands_read_the_apps_settings_and_env_wins(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = project_env(dtask_env, tmp_path, None, 15)

    def celery_dtask(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", "proj", "dtask", *args],
            cwd=PROJECT, env={**env, **extra}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    shown = celery_dtask("config")
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines()}
    assert lines["DTASK_LEASE_TTL"].split()[1:] == ["4", "(app)"]
    assert lines["DTASK_DATABASE_URL"].endswith("(app)")
    assert lines["DTASK_RESULT_BACKEND"].endswith("(app)")
    wins = celery_dtask("config", DTASK_LEASE_TTL="6")
    lines = {line.split()[0]: line for line in wins.stdout.splitlines()}
    assert lines["DTASK_LEASE_TTL"].split()[1:] == ["6", "(env)"]
    elsewhere = celery_dtask("config", DTASK_BROKER_URL="redis://elsewhere:6379/0")
    assert elsewhere.returncode == 2
    assert "DTASK_BROKER_URL is set, but this process sends through its Celery app's broker" in (
        elsewhere.stderr
    )
    migrated = celery_dtask("migrate")
    assert migrated.returncode == 0 and schema.HEAD in migrated.stdout, migrated.stderr
    unknown = celery_dtask("status", "999999999")
    assert unknown.returncode == 2 and "no run with id 999999999" in unknown.stderr
