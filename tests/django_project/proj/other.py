"""A second, plain Celery app in the same package (another team's, or a legacy one):
`dtask.init_app` was not given it, so its workers are stock Celery, whatever dtask's signal
handlers (connected when `proj` is imported) see."""

import os

from celery import Celery

broker = os.environ["PROJ_BROKER_URL"]
app = Celery("other", broker=broker, backend=os.environ.get("PROJ_RESULT_BACKEND", broker))
app.conf.task_default_queue = "other"  # beside proj's workers on the same broker


@app.task
def ping() -> str:
    return "pong"
