"""The Django project's workers and deploys (tests/django_project), run as a Django + Celery
team runs them: plain `celery -A proj worker` without `-Q` consumes dtask's queue beside its
own; dtask's worker policies (prefetch 1, the connection budget, the loops, the hand-over) apply
only to workers of the app `dtask.init_app` adopted, and prefetch only where dtask's queues are
consumed; a deploy's SIGTERM lets the team's own task finish (Celery's warm shutdown) while
dtask's running child is handed over, logged at INFO, with no WorkerLostError."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import celery
import pytest
from sqlalchemy import text

from dtask import services
from dtask.domain.runs import RunState
from tests.support.db import child_row, wait_for
from tests.support.django import Celery, django_env, manage, python

pytestmark = pytest.mark.acceptance
WORKER = ("worker", "-l", "INFO", "--without-mingle", "--without-gossip")
# The embedded Redis has Redis's 16 databases: these three are this file's brokers.
QUEUES, POLICY, DEPLOY = 4, 5, 6
HOST = socket.gethostname()

CELERY = tuple(int(part) for part in celery.__version__.split(".")[:2])


@pytest.fixture(scope="module")
def migrated(dtask_env: dict[str, str]) -> None:
    done = manage(django_env(dtask_env, QUEUES), "migrate")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def start(tmp_path: Path, migrated: None) -> Iterator[Callable[..., Celery]]:
    started: list[Celery] = []

    def start_worker(env: dict[str, str], *args: str, app: str = "proj") -> Celery:
        # `celery -A proj -A proj.other`: the last -A names the app
        argv = (*(("-A", app) if app != "proj" else ()), *WORKER, *args)
        worker = Celery(env, tmp_path / f"w{len(started)}.log", *argv)
        started.append(worker)
        return worker.wait_ready()

    yield start_worker
    for worker in started:
        worker.stop()


def in_project(env: dict[str, str], code: str) -> str:
    """Python in the project (as its web process runs it, Django set up); its stdout."""
    done = python(env, "import django; django.setup()\nimport proj\n" + code)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def submit(env: dict[str, str], n: int, delay: float, template: str = "report_range") -> int:
    module = "reports.tasks" if template == "report_total" else "reports.templates"
    code = f"from {module} import {template}\n"
    code += f"print({template}.delay(n={n}, delay={delay}).id)"
    return int(in_project(env, code))


def finished(run_id: int) -> bool:
    return services.store().runs.status(run_id).state.finished


def registered(name: str) -> tuple[str, ...] | None:
    """The queues the live worker ``name`` reported to dtask_workers (None: no row)."""
    with services.store().engine.connect() as conn:
        row = conn.execute(
            text("SELECT queues FROM dtask_workers WHERE name = :n"), {"n": name}
        ).first()
    return None if row is None else tuple(row[0])


def prefetch_count(env: dict[str, str], name: str, app: str = "proj.celery") -> int:
    """The worker's prefetch count as it reports it (concurrency times the multiplier)."""
    code = (
        f"import json\nfrom {app} import app\n"
        f"print(json.dumps(app.control.inspect([{name!r}], timeout=5).stats()))"
    )
    stats = json.loads(in_project(env, code))
    return int(stats[name]["prefetch_count"])


def test_a_worker_without_q_consumes_dtask_and_with_q_only_what_q_says(
    start: Callable[..., Celery], dtask_env: dict[str, str]
) -> None:
    env = django_env(dtask_env, QUEUES)
    plain = start(env, "-c", "2", "-n", f"plain@{HOST}")
    assert registered(f"plain@{HOST}") == ("celery", "dtask")
    run_id = submit(env, 20, 0)
    wait_for(lambda: finished(run_id), 60, f"run {run_id} to finish on a worker without -Q")
    status = services.store().runs.status(run_id)
    assert status.state is RunState.SUCCEEDED and status.result == 210, status.error
    assert "starts no run" not in plain.output()
    narrowed = start(env, "-c", "1", "-Q", "celery", "-n", f"narrowed@{HOST}")
    assert registered(f"narrowed@{HOST}") == ("celery",)  # -Q says celery: celery only
    assert "consumes celery but none of dtask's queues" in narrowed.output()
    tiered = start(env, "-c", "1", "-Q", "celery,dtask.premium", "-n", f"tiered@{HOST}")
    assert registered(f"tiered@{HOST}") == ("celery", "dtask.premium")
    assert "none of dtask's queues" not in tiered.output()


def test_policy_applies_only_to_workers_of_the_adopted_app_that_consume_dtask(
    start: Callable[..., Celery], dtask_env: dict[str, str]
) -> None:
    env = django_env(dtask_env, POLICY)
    # the adopted app, not consuming dtask: any prefetch; Celery's default 4 stays 4
    eight = start(env, "-c", "1", "-Q", "celery", "--prefetch-multiplier", "8",
                  "-n", f"eight@{HOST}")  # fmt: skip
    assert prefetch_count(env, f"eight@{HOST}") == 8
    start(env, "-c", "1", "-Q", "celery", "-n", f"four@{HOST}")
    assert prefetch_count(env, f"four@{HOST}") == 4
    # ... and still serves the cluster: it reports itself (its loops run; docs/django.md)
    assert registered(f"eight@{HOST}") == ("celery",)
    assert "consumes celery but none of dtask's queues" in eight.output()
    # a second, plain Celery app in the same package: stock Celery, nothing of dtask's
    other = start(env, "-c", "1", "--prefetch-multiplier", "8", "-n", f"other@{HOST}",
                  app="proj.other")  # fmt: skip
    assert prefetch_count(env, f"other@{HOST}", "proj.other") == 8
    assert registered(f"other@{HOST}") is None
    assert re.search(r"app:\s+other:", other.output())
    assert "dtask" not in other.output().split(" ready.", 1)[1]
    assert in_project(env, "from proj.other import ping\nprint(ping.delay().get(timeout=30))") == (
        "pong"
    )
    # a worker of the adopted app consuming dtask is still held to prefetch 1
    refused = Celery(env, eight.log.with_name("refused.log"), *WORKER, "--prefetch-multiplier", "8")
    assert refused.proc.wait(120) == 2
    refused.stop()
    assert "dtask: worker_prefetch_multiplier is 8; dtask's children need 1" in refused.output()


def report_rows(name: str) -> int:
    with services.store().engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM reports_report WHERE name = :n"), {"n": name}
            ).scalar_one()
        )


def test_a_deploys_sigterm_lets_the_teams_task_finish_and_hands_dtasks_child_over(
    start: Callable[..., Celery], dtask_env: dict[str, str]
) -> None:
    env = django_env(dtask_env, DEPLOY)
    leaving = start(env, "-c", "2", "-n", f"leaving@{HOST}")
    in_project(env, "from reports.tasks import slow_report\nslow_report.delay('deploy', 15)")
    run_id = submit(env, 40, 0.5, "report_total")  # 4 children of 5 s; one slot is slow_report's
    wait_for(
        lambda: any(child_row(run_id, i).checkpoint for i in range(4)), 60, "a child to checkpoint"
    )
    code = (
        "import json\nfrom proj.celery import app\n"
        f"print(json.dumps(app.control.inspect(['leaving@{HOST}'], timeout=5).active()))"
    )
    active = json.loads(in_project(env, code))[f"leaving@{HOST}"]
    assert sorted(t["name"] for t in active) == ["dtask.child", "reports.tasks.slow_report"]
    sent = time.monotonic()
    leaving.terminate()  # SIGTERM to the main process only, as a deploy sends it
    assert leaving.proc.wait(60) == 0
    print(f"\nthe worker exited {time.monotonic() - sent:.2f} s after SIGTERM")
    log = leaving.output()
    assert report_rows("deploy") == 1, log[-3000:]  # the team's task finished
    assert re.search(r"reports\.tasks\.slow_report\[\S+\] succeeded in", log), log[-3000:]
    assert "stopped at its checkpoint and was released" in log  # dtask's child handed over
    if CELERY >= (5, 7):
        # Before 5.7 a child prefetched while both processes were busy can be handed to a
        # process as warm shutdown ends it: one WorkerLostError (its message is restored and
        # runs on the next worker; the run's result below is still exact). docs/django.md.
        assert "WorkerLostError" not in log, log[-3000:]
        assert not [line for line in log.splitlines() if "ERROR/" in line], log[-3000:]
    start(env, "-c", "2", "-n", f"after@{HOST}")
    wait_for(lambda: finished(run_id), 90, f"run {run_id} to finish on the next worker")
    status = services.store().runs.status(run_id)
    assert status.state is RunState.SUCCEEDED and status.result == 820, status.error
