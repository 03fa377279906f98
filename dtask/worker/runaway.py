"""The last resort for a child that does not stop when asked: end its pool process.

Celery's own time limits would record the task as FAILED in the result backend, which the
chord counts as the child's final result. dtask wants the attempt counted and retried from its
checkpoint instead. A prefork pool process that dies under ``task_acks_late`` +
``task_reject_on_worker_lost`` has its message requeued, nothing written to the backend, and
the pool starts a replacement. So: record what happened in PostgreSQL (under the fence), then
SIGKILL this process from a thread that still runs (the heartbeat's).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger("dtask.worker")


_pool_process: bool | None = None  # asked again after a fork


def in_pool_process() -> bool:
    global _pool_process
    if _pool_process is None:
        from billiard.process import current_process

        _pool_process = current_process().name.startswith("ForkPoolWorker")
    return _pool_process


def _forked() -> None:
    global _pool_process
    _pool_process = None


os.register_at_fork(after_in_child=_forked)


def kill_this_pool_process(why: str, record: Callable[[], object]) -> None:
    """Call ``record`` (its errors are logged), then SIGKILL this prefork pool process.
    Outside a pool process (``-P solo``/``threads``) killing would take the worker with it:
    only record and log."""
    try:
        record()
    except Exception as exc:
        log.warning("%s; recording it failed: %s", why, exc)
    if not in_pool_process():
        log.error("%s; it cannot be ended outside a prefork pool process", why)
        return
    log.error("%s: killing pool process %s (the pool starts another)", why, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
