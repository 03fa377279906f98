"""The project's test settings (`manage.py test --settings=proj.test_settings`): dtask in test
mode, as a team turns it on for its unit tests. A submit runs its run in the test's process,
in the test database, before it returns; nothing goes to the broker, so the broker here is a
port nothing listens on."""

import os

from proj.settings import *  # noqa: F403

CELERY_BROKER_URL = CELERY_RESULT_BACKEND = "redis://127.0.0.1:9/0"
# Either turns test mode on: Celery's own switch, or dtask's (PROJ_EAGER picks, for the tests
# of this project's tests)
if os.environ.get("PROJ_EAGER", "dtask") == "celery":
    CELERY_TASK_ALWAYS_EAGER = True
else:
    CELERY_DTASK_EAGER = True
