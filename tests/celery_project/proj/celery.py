"""The project's Celery app: its own settings, then one line to adopt dtask."""

import os

from celery import Celery

import dtask

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    broker_url=os.environ["PROJ_BROKER_URL"],
    result_backend=os.environ["PROJ_RESULT_BACKEND"],
    task_serializer="json",
    worker_hijack_root_logger=True,
    beat_schedule={
        "add-every-second": {"task": "proj.tasks.add", "schedule": 1.0, "args": (2, 3)},
        # a dtask run from Celery's own beat: the task dtask.submit (Template.s() builds it)
        "range-every-3s": {
            "task": "dtask.submit",
            "schedule": 3.0,
            "kwargs": {"template": "proj_range", "variables": {"n": 20, "delay": 0}},
        },
    },
    # dtask's own settings, the Celery way (a DTASK_* variable would win)
    dtask_database_url=os.environ["PROJ_DATABASE_URL"],
    dtask_lease_ttl=4,
    dtask_stall_timeout=6,
)
dtask.init_app(app)
