"""The Celery side: the app, the thin tasks (master, child, finalize), chord dispatch, the
reaper, beat's scheduler, heartbeats and the drain hand-over."""

import dtask.worker.batch  # registers children (several children in one message)
import dtask.worker.revoke  # what a revoke of a dtask task means (a signal handler)
import dtask.worker.tasks  # noqa: F401  (registers master, child and finalize on ``app``)
from dtask.worker.app import app, configure

__all__ = ["app", "configure"]
