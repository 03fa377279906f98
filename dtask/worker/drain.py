"""Scale-down as hand-over: a stopping worker gives its running children away at once, and
leaves every other task to Celery's warm shutdown, which lets it finish.

Celery tells only the main process that it is shutting down, and prefork pool processes die
at once on SIGTERM. So a pool process running one of dtask's tasks that run children (a child,
a message of children, a master: each arms it) turns SIGTERM into a drain flag, and the main
process, when its shutdown starts, sets a flag its pool processes share (``stopping``) and
forwards SIGTERM to those pool processes only. A host's own task is never signalled: under
SIGTERM to the main process only (as Kubernetes and ``docker stop`` send it) it finishes, as in
stock Celery; under SIGTERM to the whole process group it dies at once, as in stock Celery.

A draining child stops at its next step (``ctx.should_stop()``; ``ctx.resume`` between items),
commits its checkpoint, releases its lease and re-sends itself (an INFO line), so another
worker resumes it right away; a child that starts while its worker is stopping is handed over
before it runs. A child that ignores the request is released from its last committed
checkpoint when ``DTASK_DRAIN_GRACE`` runs out and its process exits.

While its worker is stopping, a pool process that handed its child over stays: its task
returns, and Celery's warm shutdown ends the process with the others, so no job is lost with
it (billiard would log one as a WorkerLostError). A pool process that gets SIGTERM on its own
(autoscale shrinking the pool, an operator's ``kill``, ``revoke(terminate=True)``) leaves as
billiard's own handler makes it: at once when idle or running a host's task, right after the
hand-over when running one of dtask's tasks that run children (its message, already re-sent,
may come back once more: the claim drops the duplicate). It never stays to take and bounce
further work, and after ``revoke(terminate=True)`` (billiard then counts any job the process
holds when it exits as terminated) it holds no other job.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from celery.exceptions import WorkerShutdown
from celery.signals import worker_shutting_down
from celery.worker import state as worker_state
from celery.worker.control import control_command

from dtask.worker import scope
from dtask.worker.app import current
from dtask.worker.task_table import CHILD, CHILDREN, MASTER, MASTERS, PICKUP

log = logging.getLogger("dtask.drain")

DRAIN_COMMAND = "dtask_drain"
# the tasks that run children: they arm
HANDED_OVER = frozenset({MASTER, MASTERS, PICKUP, CHILD, CHILDREN})
DRAINING = threading.Event()  # this process got SIGTERM while it ran one of them
# One byte the main process shares with every pool process it forks (an anonymous shared
# mapping made at import, in the main process before its pool forks): 1 once it is stopping.
_stopping = mmap.mmap(-1, 1)
_give_up: Callable[[], None] | None = None  # set while this process runs a child
_lock = threading.Lock()


def stopping() -> bool:
    """Whether this process's worker is shutting down (read in its pool processes too)."""
    return _stopping[0] == 1


def draining() -> bool:
    """Whether a child here is to be handed over rather than run on: this process got SIGTERM,
    or its worker is shutting down."""
    return DRAINING.is_set() or _stopping[0] == 1


def running(give_up: Callable[[], None] | None) -> None:
    """Register what to do if the running child ignores a drain request (None: idle)."""
    global _give_up
    with _lock:
        _give_up = give_up


def _on_sigterm(signum: int, frame: Any) -> None:
    with _lock:
        give_up = _give_up
    if give_up is None and not _runs_handed_over():
        leave()  # nothing here to hand over: leave now (idle, a host's task)
        return
    if DRAINING.is_set():
        return
    DRAINING.set()  # a stopping worker's master or message of children hands the rest over
    if give_up is not None:
        timer = threading.Timer(_grace(), _after_grace, args=(give_up,))
        timer.daemon = True
        timer.start()


def _runs_handed_over() -> bool:
    """Whether this pool process is running one of HANDED_OVER now (a master in its split, a
    message of children between two): what is left of it is handed over, and it returns. So
    too when the worker is not (yet) stopping: under a process group's SIGTERM the pool hears
    it before the main process sets ``stopping``, and leaving then would run the message's
    children again."""
    task = current().current_worker_task
    return task is not None and task.name in HANDED_OVER


def finished() -> None:
    """At the end of a task that ran a child: a process that got SIGTERM leaves now, unless
    its worker is stopping: then the task returns, and Celery's warm shutdown ends the process
    without a lost job."""
    if DRAINING.is_set() and not stopping():
        leave()


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
    """Turn SIGTERM into a drain request in this pool process. Called from the tasks of
    HANDED_OVER themselves: billiard resets the pool's signal handlers after
    worker_process_init runs. A pool process that never ran one keeps billiard's handler: it
    has nothing to hand over."""
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
    """The main process's shutdown, told to the pool processes that run dtask's children and
    to no other: a host's own tasks finish under Celery's warm shutdown."""
    if not scope.this_worker():
        return  # another app's worker: stock Celery (dtask/worker/scope.py)
    import psutil

    _stopping[0] = 1  # before any pool process hears: a task ending now stays, not leaves
    ours = {
        r.worker_pid
        for r in list(worker_state.active_requests)
        if r.type in HANDED_OVER and r.worker_pid
    }
    for child in psutil.Process().children():
        if child.pid in ours:
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
