"""Which of the app's own ``beat_schedule`` entries dtask's beat scheduler loads:
DTASK_BEAT_APP_ENTRIES (on by default; off beside django-celery-beat's beat). No services: the
scheduler is built, never ticked (tests/acceptance/test_django_project.py runs the beats)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator

import pytest
from celery import Celery

from dtask import services
from dtask.worker.beat import DatabaseScheduler

DJANGO_CELERY_BEAT = "django_celery_beat.schedulers:DatabaseScheduler"
Make = Callable[..., DatabaseScheduler]


@pytest.fixture
def make(monkeypatch: pytest.MonkeyPatch) -> Iterator[Make]:
    for name in [n for n in os.environ if n.upper().startswith("DTASK_")]:
        monkeypatch.delenv(name)
    # URLs nothing listens on, never connected to: without them, resolving the services
    # started an embedded PostgreSQL in the user's own ~/.local/state/dtask
    monkeypatch.setenv("DTASK_DATABASE_URL", "postgresql+psycopg://dtask@127.0.0.1:9/none")
    monkeypatch.setenv("DTASK_BROKER_URL", "redis://127.0.0.1:9/0")
    services.reset()

    def scheduler(**conf: object) -> DatabaseScheduler:
        app = Celery("team", set_as_current=False)
        app.conf.update(beat_schedule={"tick": {"task": "team.tick", "schedule": 1.0}}, **conf)
        return DatabaseScheduler(app=app)

    yield scheduler
    services.reset()


def test_by_default_it_sends_the_apps_entries(make: Make) -> None:
    scheduler = make()
    assert "tick" in scheduler.schedule
    assert "1 entries of beat_schedule" in scheduler.info


def test_off_it_leaves_the_apps_entries_to_another_beat(
    make: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("DTASK_BEAT_APP_ENTRIES", "0")
    with caplog.at_level(logging.INFO, logger="dtask.beat"):
        scheduler = make(beat_scheduler=DJANGO_CELERY_BEAT)
    assert dict(scheduler.schedule) == {}  # nothing to send, no lease to take
    assert "left to another beat (DTASK_BEAT_APP_ENTRIES=0)" in scheduler.info
    assert "beat_schedule entries (tick) are left to another beat" in caplog.text
    assert "sent twice" not in caplog.text


@pytest.mark.parametrize(
    ("configured", "warned"),
    [
        (None, False),
        ("celery.beat:PersistentScheduler", False),
        ("dtask.worker.beat:DatabaseScheduler", False),
        (DJANGO_CELERY_BEAT, True),
    ],
)
def test_sending_them_while_the_app_names_another_scheduler_warns(
    make: Make, caplog: pytest.LogCaptureFixture, configured: str | None, warned: bool
) -> None:
    with caplog.at_level(logging.INFO, logger="dtask.beat"):
        scheduler = make(**({"beat_scheduler": configured} if configured else {}))
    assert "tick" in scheduler.schedule
    assert ("each entry is sent twice; set DTASK_BEAT_APP_ENTRIES=0" in caplog.text) is warned
