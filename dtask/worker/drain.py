"""Scale-down as hand-over: a stopping worker gives its running children away at once.

Celery tells only the main process that it is shutting down, and prefork pool processes die
at once on SIGTERM. So every pool process turns SIGTERM into a drain flag, and the main process
forwards SIGTERM to its pool when its shutdown starts: the same path whether SIGTERM reached
the main process only or the whole process group (as container runtimes send it).

A draining child stops at its next step (``ctx.should_stop()``; ``ctx.resume`` between items),
commits its checkpoint, releases its lease and re-sends itself, so another worker resumes it
right away. A child that ignores the request is released from its last committed checkpoint
when ``DTASK_DRAIN_GRACE`` runs out and its process exits. A pool process that gets SIGTERM
leaves as soon as it has no child to hand over, as billiard's own handler makes it: at once
when idle (autoscale shrinking the pool), right after the hand-over when busy (its message,
already re-sent, may come back once more: the claim drops the duplicate). It never stays to
take and bounce further work, and after ``revoke(terminate=True)`` (billiard then counts any
job the process holds when it exits as terminated) it holds no other job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from celery.exceptions import WorkerShutdown
from celery.signals import worker_shutting_down
from celery.worker.control import control_command

log = logging.getLogger("dtask.drain")

DRAIN_COMMAND = "dtask_drain"
DRAINING = threading.Event()
_give_up: Callable[[], None] | None = None  # set while this process runs a child
_lock = threading.Lock()


def running(give_up: Callable[[], None] | None) -> None:
    """Register what to do if the running child ignores a drain request (None: idle)."""
    global _give_up
    with _lock:
        _give_up = give_up


def _on_sigterm(signum: int, frame: Any) -> None:
    with _lock:
        give_up = _give_up
    if give_up is None:  # no child here to hand over: leave now (autoscale shrink, a drain)
        leave()
        return
    if DRAINING.is_set():
        return
    DRAINING.set()
    timer = threading.Timer(_grace(), _after_grace, args=(give_up,))
    timer.daemon = True
    timer.start()


def leave() -> None:
    """End this pool process as billiard's own SIGTERM handler does: the pool starts another
    one, and a task in progress counts as lost with its process, so Celery requeues its
    message (``task_reject_on_worker_lost``). Returns only where nothing was armed."""
    previous = _billiards_handler
    if callable(previous):
        previous(signal.SIGTERM, None)
    elif _armed:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _after_grace(give_up: Callable[[], None]) -> None:
    with _lock:
        still = _give_up is give_up
    if still:
        log.warning("child did not stop within the drain grace period: releasing it")
        give_up()
        os._exit(0)


def _grace() -> float:
    from dtask import services

    return services.current().settings.drain_grace


_armed = False
_billiards_handler: Any = None


def arm() -> None:
    """Turn SIGTERM into a drain request in this pool process. Called from the child task
    itself: billiard resets the pool's signal handlers after worker_process_init runs. An idle
    pool process that never ran a child keeps billiard's handler: it has nothing to hand over.
    """
    global _armed
    if _armed or threading.current_thread() is not threading.main_thread():
        return
    from billiard.process import current_process

    # Only in a prefork pool process: with -P solo this is the worker's main process, whose
    # SIGTERM handler is Celery's own shutdown.
    if current_process().name.startswith("ForkPoolWorker"):
        global _billiards_handler
        _billiards_handler = signal.signal(signal.SIGTERM, _on_sigterm)
        _armed = True


def _forward_to_pool(**_: Any) -> None:
    import psutil

    for child in psutil.Process().children():
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signal.SIGTERM)


@control_command(name=DRAIN_COMMAND)
def _drain_from_remote(state: Any, **_: Any) -> None:
    """`dtask drain WORKER`: Celery's remote shutdown does not announce itself to signal
    handlers, so hand the pool's children over first, then shut down the same way."""
    log.warning("draining on request: handing running children over, then stopping")
    _forward_to_pool()
    raise WorkerShutdown(0)


def install() -> None:
    """Called by `dtask worker`: the main process forwards its shutdown to the pool."""
    worker_shutting_down.connect(_forward_to_pool, weak=False)
