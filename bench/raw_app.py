"""The raw Celery baseline: the same trivial children as ``bench_noop``, as a hand-written
chord on the same Redis (its own queue, ``raw``): with dtask's Celery settings, or, with
DTASK_BENCH_RAW=stock, Celery's own defaults as a user runs it (only the broker and backend set;
events off, prefetch 4; its worker logs at WARNING)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from dtask.settings import load
from dtask.worker.config import celery_settings

RAW_QUEUE = "raw"

STOCK = os.environ.get("DTASK_BENCH_RAW") == "stock"

app = Celery("rawbench", set_as_current=False)
settings = celery_settings(load())
if STOCK:
    app.conf.update(broker_url=settings["broker_url"], result_backend=settings["result_backend"])
else:
    app.conf.update(settings)
app.conf.task_default_queue = RAW_QUEUE


@app.task(name="raw.child")
def child(a: int, b: int) -> None:
    return None


@app.task(name="raw.sleep1ms")
def sleep1ms() -> None:
    """bench.small_runs: the same 1 ms of work as one ``bench_one`` run."""
    time.sleep(0.001)


@app.task(name="raw.done")
def done(results: list[Any]) -> int:
    return len(results)


@app.task(name="raw.done_chunks")
def done_chunks(results: list[list[Any]]) -> int:
    """bench.raw_client --chunks: the children counted across their chunks' results."""
    return sum(len(chunk) for chunk in results)
