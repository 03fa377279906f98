"""The raw Celery baseline: the same trivial children as ``bench_noop``, as a hand-written
chord, with dtask's Celery settings on the same Redis (its own queue, ``raw``)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from dtask.settings import load
from dtask.worker.config import celery_settings

RAW_QUEUE = "raw"

app = Celery("rawbench", set_as_current=False)
app.conf.update(celery_settings(load()))
app.conf.task_default_queue = RAW_QUEUE


@app.task(name="raw.child")
def child(a: int, b: int) -> None:
    return None


@app.task(name="raw.done")
def done(results: list[Any]) -> int:
    return len(results)
