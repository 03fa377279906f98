"""dtask in a Django project as a Django + Celery team has one (tests/django_project): its
settings are `CELERY_DTASK_*` keys in settings.py, its commands `celery -A proj dtask ...`,
and its beat django-celery-beat's, beside dtask's. No DTASK_* variable is set."""

from __future__ import annotations

import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from dtask import services
from tests.support.db import wait_for
from tests.support.django import Celery, celery, django_env, manage

pytestmark = pytest.mark.acceptance
# The embedded Redis has Redis's 16 databases: one of its own for this file's broker.
VHOST = 3
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
TICK = "reports.periodic.tick"


@pytest.fixture(scope="module")
def env(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    # HOME of its own: a process that missed CELERY_DTASK_DATABASE_URL would start an embedded
    # PostgreSQL under ~/.local/state/dtask, not the session's
    home = tmp_path_factory.mktemp("django-home")
    project = {**django_env(dtask_env, VHOST), "HOME": str(home)}
    migrated = manage(project, "migrate")
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return project


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Celery]]:
    started: list[Celery] = []

    def start_process(env: dict[str, str], *args: str, ready: str = " ready.") -> Celery:
        process = Celery(env, tmp_path / f"{len(started)}-{args[0]}.log", *args, ready=ready)
        started.append(process)
        return process.wait_ready()

    yield start_process
    for process in reversed(started):
        process.stop()


def no_traceback(result: object) -> str:
    """A command's stderr, once it is known to hold no traceback."""
    stderr: str = getattr(result, "stderr", "")
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr


# --- settings the Django way (issue 36, item 1) ---


def test_celery_dtask_settings_in_settings_py_are_dtask_s(env: dict[str, str]) -> None:
    """CELERY_DTASK_DATABASE_URL, _TEMPLATES and _LEASE_TTL in settings.py, read through
    `config_from_object(..., namespace="CELERY")`: a submit from the project's own process
    (`manage.py shell`, as its web process) finds the template and lands in the configured
    database, and `celery -A proj dtask config` says each came from the app."""
    code = (
        "import json, dtask\n"
        "from dtask import services\n"
        "run = dtask.submit('report_range', {'n': 5, 'delay': 0})\n"
        "now = services.current()\n"
        "print(json.dumps({'run': run.id, 'database_url': now.database_url,"
        " 'templates': list(now.settings.templates), 'lease_ttl': now.settings.lease_ttl}))\n"
    )
    shell = manage(env, "shell", "-c", code)
    assert shell.returncode == 0, shell.stderr[-3000:]
    seen = json.loads(shell.stdout.strip().splitlines()[-1])
    assert seen["database_url"] == env["PROJ_DATABASE_URL"]
    assert seen["templates"] == ["reports.templates", "reports.periodic"]
    assert seen["lease_ttl"] == 4
    run = services.store().runs.status(seen["run"])  # the session's database is the project's
    assert run.template == "report_range"
    services.store().runs.cancel(seen["run"])  # no worker here: leave nothing pending

    config = celery(env, "dtask", "config", "--json")
    assert config.returncode == 0, config.stderr[-3000:]
    shown = json.loads(config.stdout)
    assert shown["DTASK_DATABASE_URL"]["source"] == "app"
    assert shown["DTASK_TEMPLATES"] == {
        "value": ["reports.templates", "reports.periodic"],
        "source": "app",
    }
    assert shown["DTASK_LEASE_TTL"] == {"value": 4, "source": "app"}


# --- `celery -A proj dtask ...` with Django's apps (issue 36, item 3) ---


def test_celery_dtask_lists_templates_whose_module_imports_a_model(env: dict[str, str]) -> None:
    """reports.periodic imports reports.models at its top: dtask must let the app load as
    `celery worker` does (Django set up by Celery's fixup) before it imports the templates."""
    result = celery(env, "dtask", "templates")
    no_traceback(result)
    assert result.returncode == 0, result.stderr[-3000:]
    listed = {line.split("(")[0] for line in result.stdout.splitlines()}
    assert {"report_range", "record_range"} <= listed, result.stdout


def test_celery_dtask_submit_and_schedule_add_in_a_django_project(env: dict[str, str]) -> None:
    submitted = celery(env, "dtask", "submit", "report_range", "-e", "n=5", "-e", "delay=0")
    no_traceback(submitted)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    run_id = int(submitted.stdout.split()[1])  # "run 12 ..."
    assert services.store().runs.status(run_id).template == "report_range"
    services.store().runs.cancel(run_id)

    name = f"cb-{uuid.uuid4().hex[:8]}"
    added = celery(
        env, "dtask", "schedule", "add", name, "record_range", "-e", "name=x", "-e", "n=1",
        "--every", "3600",
    )  # fmt: skip
    no_traceback(added)
    assert added.returncode == 0, added.stderr[-3000:]
    assert f"schedule {name}  record_range  enabled" in added.stdout
    removed = celery(env, "dtask", "schedule", "rm", name)
    assert removed.returncode == 0, removed.stderr[-3000:]


# --- dtask's beat beside django-celery-beat (issue 36, item 4) ---


def executions(name: str, since: datetime, until: datetime) -> list[datetime]:
    """When the team's task `tick` ran with ``name`` (the rows it wrote)."""
    with services.store().engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT created_at FROM reports_report WHERE name = :n"
                    " AND created_at >= :a AND created_at < :b ORDER BY created_at"
                ),
                {"n": name, "a": since, "b": until},
            ).scalars()
        )


def slot_runs(schedule: str) -> Counter[datetime]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT slot FROM dtask_runs WHERE schedule = :s"), {"s": schedule}
        ).scalars()
        return Counter(rows)


def all_finished(schedule: str) -> bool:
    with services.store().engine.connect() as conn:
        states = conn.execute(
            text("SELECT DISTINCT state FROM dtask_runs WHERE schedule = :s"), {"s": schedule}
        ).scalars()
        return set(states) == {"succeeded"}


@pytest.fixture
def tick(env: dict[str, str]) -> Iterator[str]:
    """The team's beat_schedule entry `tick` (every second), synced by django-celery-beat into
    its tables; taken out of them afterwards, or a later beat would go on sending it."""
    name = f"tick-{uuid.uuid4().hex[:8]}"
    yield name
    code = (
        "from django_celery_beat.models import PeriodicTask\n"
        "PeriodicTask.objects.filter(name='tick').delete()\n"
    )
    manage(env, "shell", "-c", code)


def test_dtask_beat_beside_django_celery_beat_sends_the_team_s_entries_once(
    env: dict[str, str], tick: str, start: Callable[..., Celery]
) -> None:
    """The team runs django-celery-beat for its own entries and dtask's beat for dtask's
    schedules, with `CELERY_DTASK_BEAT_APP_ENTRIES = False`: each of the team's slots runs
    its task once (twice when dtask's beat sends the app's entries too), and each slot of a
    dtask schedule has one run."""
    beat_env = {**env, "PROJ_TICK": tick, "PROJ_BEAT_APP_ENTRIES": "0"}
    schedule = f"cb-{uuid.uuid4().hex[:8]}"
    added = celery(
        env, "dtask", "schedule", "add", schedule, "record_range", "-e", f"name={schedule}",
        "-e", "n=1", "--every", "1",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr[-3000:]
    try:
        start(beat_env, "worker", "-l", "INFO", "--without-mingle", "--without-gossip", "-c", "2")
        started = "beat: Starting..."
        django_beat = start(
            beat_env, "beat", "-l", "INFO", "-S", "django_celery_beat.schedulers:DatabaseScheduler",
            ready=started,
        )  # fmt: skip
        dtask_beat = start(beat_env, "dtask", "beat", ready=started)
        # both beats in their stride: each has sent a first tick, dtask's has fired slots
        wait_for(lambda: len(executions(tick, EPOCH, now())) >= 3, 60, "the first ticks")
        wait_for(lambda: len(slot_runs(schedule)) >= 2, 60, "the schedule's first slots")
        since = now()
        first_slots = len(slot_runs(schedule))
        wait_for(lambda: len(slot_runs(schedule)) >= first_slots + 10, 60, "ten more slots")
        until = now()
        django_beat.stop()  # every tick it sent is then in the queue or done
        dtask_beat.stop()
    finally:
        removed = celery(env, "dtask", "schedule", "rm", schedule)
        assert removed.returncode == 0, removed.stderr[-3000:]
    sending = f"Sending due task tick ({TICK})"
    sent = django_beat.output().count(sending)
    wait_for(lambda: len(executions(tick, EPOCH, now())) >= sent, 60, "the ticks sent to run")
    wait_for(lambda: all_finished(schedule), 60, "the schedule's runs to finish")
    seconds = (until - since).total_seconds()
    ran = executions(tick, since, until)
    runs = slot_runs(schedule)
    print(
        f"\nteam's tick: {len(ran)} executions in {seconds:.1f} s"
        f" ({len(ran) / seconds:.2f} per 1 s slot); sent {sent} times by django-celery-beat's"
        f" beat, {dtask_beat.output().count(sending)} by dtask's, run"
        f" {len(executions(tick, EPOCH, now()))} times; dtask schedule: {len(runs)} slots, most"
        f" runs in one slot {max(runs.values())}"
    )
    assert sending not in dtask_beat.output()
    assert len(executions(tick, EPOCH, now())) == sent  # each sending ran once, nothing else
    assert 0.6 * seconds <= len(ran) <= seconds + 1, (len(ran), seconds)
    assert set(runs.values()) == {1}
    # each slot's run ran its one child once: one row each
    assert len(executions(schedule, EPOCH, now())) == len(runs)
    slots = sorted(runs)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(slots))
    assert "left to another beat" in dtask_beat.output()


def now() -> datetime:
    return datetime.now(UTC)
