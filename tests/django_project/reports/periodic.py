"""What the team runs on a clock, written as Django code is: the model imported at the top, so
a process must set Django up before it imports this module (Celery's worker and beat do it
before they import `CELERY_IMPORTS`; `celery -A proj dtask ...` must too, since this module is
in `CELERY_DTASK_TEMPLATES`).

`tick` is a task of the team's own, fired by a `beat_schedule` entry (the tests add one with
PROJ_TICK); `record_range` is a dtask template whose children write the team's rows."""

from celery import shared_task

import dtask
from reports.models import Report


@shared_task
def tick(name: str) -> None:
    Report.objects.create(name=name, value=1)


@dtask.template(
    "record_range",
    params={"name": str, "n": int},
    skeleton={"start": 1, "end": "${n}", "name": "${name}"},
    split=dtask.RangeSplit("start", "end", chunk=10, carry=("name",)),
)
def record_range(ctx: dtask.ChildContext, a: int, b: int, name: str) -> None:
    Report.objects.bulk_create(Report(name=name, value=i) for i in range(a, b + 1))
