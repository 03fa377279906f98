"""The project's settings: Django's, Celery's under the CELERY_ namespace, dtask's as
CELERY_DTASK_* keys. Services come from PROJ_* variables (the tests' embedded ones)."""

import os
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_celery_beat",
    "reports",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_db = make_url(os.environ["PROJ_DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.database,
        "USER": _db.username or "",
        "PASSWORD": _db.password or "",
        "HOST": str(_db.query.get("host", _db.host or "")),
        "PORT": str(_db.port or ""),
    }
}

CELERY_BROKER_URL = os.environ["PROJ_BROKER_URL"]
CELERY_RESULT_BACKEND = os.environ.get("PROJ_RESULT_BACKEND", CELERY_BROKER_URL)
CELERY_TASK_SERIALIZER = "json"
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
CELERY_IMPORTS = ["reports.periodic"]  # the team's clock work (tick)
if os.environ.get("PROJ_TICK"):  # tests only: an entry of the team's own, every second
    CELERY_BEAT_SCHEDULE["tick"] = {
        "task": "reports.periodic.tick",
        "schedule": 1.0,
        "args": [os.environ["PROJ_TICK"]],
    }

# dtask, the Django way: CELERY_ namespace, read by dtask.init_app(app)
CELERY_DTASK_DATABASE_URL = os.environ["PROJ_DATABASE_URL"]
CELERY_DTASK_TEMPLATES = "reports.templates,reports.periodic"
CELERY_DTASK_LEASE_TTL = 4
CELERY_DTASK_STALL_TIMEOUT = 6
if os.environ.get("PROJ_BEAT_APP_ENTRIES"):  # tests only: "0" when django-celery-beat runs them
    CELERY_DTASK_BEAT_APP_ENTRIES = os.environ["PROJ_BEAT_APP_ENTRIES"] == "1"
