"""Chains that wait: in a Celery chain, the step after a template's signature (the task
``dtask.submit``) runs when the run has finished, with the run's result.

The submit task takes the rest of its chain over (``request.chain``, and ``request.callbacks``
/ ``errbacks`` for ``link`` / ``link_error``), keeps it with the run (``dtask_runs.chains``,
JSON: signatures are dicts) and clears it on its request, so Celery does not continue it with
the run's id. Whoever ends the run sends it: the next step with the run's result (as Celery's
trace does after a task succeeds), or, for a failed or cancelled run, the chain failed with the
run's error (as Celery's ``mark_as_failure`` does: the later steps' results are stored as
failures and the errbacks are called). The chains are taken in the transaction that clears
them, so a finalize delivered twice sends them once; the reaper's step sends those a finalizer
could not (a cancel, a late run failed, a broker error, a crash)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from celery import Task, signature
from celery._state import get_current_task
from celery.app.task import Context

from dtask.db.runs import Chained, RunRecord
from dtask.domain.runs import RunState
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.exceptions import RunCancelled, RunFailed
from dtask.worker.app import current
from dtask.worker.task_table import CHAINS

log = logging.getLogger("dtask.worker")


class ChainStore(Protocol):
    def get(self, run_id: int) -> RunRecord: ...
    def add_chain(self, run_id: int, chain: dict[str, Any]) -> RunState: ...
    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool: ...
    def chained_finished(self, settled_for: float, limit: int = 100) -> list[int]: ...


class HasChains(Protocol):
    @property
    def runs(self) -> ChainStore: ...


def take_over(task: Task, store: HasChains, run_id: int) -> None:
    """The submit task ``task`` hands what follows it in its chain to run ``run_id`` (nothing
    to do outside a chain, without ``link`` / ``link_error``); sent at once if the run has
    already finished (a trigger key's earlier run)."""
    request = task.request
    chain, callbacks, errbacks = request.chain, request.callbacks, request.errbacks
    if not (chain or callbacks or errbacks):
        return
    kept = {
        "id": request.id,
        "root_id": request.root_id or request.id,
        "chain": list(chain) if chain else None,
        "callbacks": list(callbacks) if callbacks else None,
        "errbacks": list(errbacks) if errbacks else None,
    }
    state = store.runs.add_chain(run_id, kept)
    request.chain = request.callbacks = request.errbacks = None  # the run continues them
    log.info("run %s: the rest of task %s's chain waits for it", run_id, request.id)
    if state.finished:
        continue_chains(store, run_id)


def after_finish(store: HasChains, run_id: int, producer: Callable[[], Any] | None = None) -> None:
    """The run has ended: the chains waiting for it (if any) are sent here inside a task (a
    pool process: a failed run's errbacks are the user's code and run where the run ended, as
    Celery runs a failed task's); elsewhere (the reaper's pass, a revoke in a worker's main
    process) a worker's pool is asked to (``dtask.chains``). A failure is left to the
    reaper's step."""
    try:
        if get_current_task() is not None:
            continue_chains(store, run_id)
        elif store.runs.get(run_id).chained:
            send_chains(run_id, producer() if producer is not None else None)
    except Exception as exc:
        log.warning("run %s: its chains not sent yet (the reaper will): %s", run_id, exc)


def send_chains(run_id: int, through: Any = None) -> None:
    current().send_task(
        CHAINS,
        args=(run_id,),
        queue=DEFAULT_QUEUE,
        argsrepr=f"run {run_id}",
        ignore_result=True,
        producer=through,
    )


def continue_chains(store: HasChains, run_id: int) -> bool:
    """Send the chains waiting for the finished run ``run_id`` (once, whoever asks); a failed
    run's errbacks are called after the chains are cleared. False: nothing was waiting."""
    later: list[Callable[[], None]] = []
    sent = store.runs.take_chains(run_id, lambda chained: _send(chained, later))
    for call in later:
        call()
    return sent


def _send(chained: Chained, later: list[Callable[[], None]]) -> None:
    app = current()
    if chained.state is RunState.SUCCEEDED:
        for kept in chained.chains:
            parent, root = kept["id"], kept.get("root_id") or kept["id"]
            for callback in kept.get("callbacks") or []:
                signature(callback, app=app).apply_async(
                    (chained.result,), parent_id=parent, root_id=root
                )
            rest = kept.get("chain") or []
            if rest:
                signature(rest[-1], app=app).apply_async(
                    (chained.result,), chain=rest[:-1], parent_id=parent, root_id=root
                )
        log.info("run %s: its chains continue with its result", chained.run_id)
        return
    exc = (
        RunCancelled(f"run {chained.run_id} was cancelled")
        if chained.state is RunState.CANCELLED
        else RunFailed(f"run {chained.run_id} failed: {chained.error}")
    )
    for kept in chained.chains:
        request = Context(
            id=kept["id"],
            root_id=kept.get("root_id") or kept["id"],
            task="dtask.submit",
            chain=kept.get("chain"),
            errbacks=kept.get("errbacks"),
            chord=None,
            group=None,
            delivery_info={},
        )
        # the later steps' results fail with the run's error (a chain's AsyncResult.get()
        # raises it), as when a task of the chain fails; the submit step keeps its SUCCESS
        app.backend.mark_as_failure(
            kept["id"], exc, request=request, store_result=True, call_errbacks=False
        )
        if request.errbacks:
            later.append(partial(_errbacks, app, request, exc))
    log.info("run %s: its chains fail with its error: %s", chained.run_id, exc)


def _errbacks(app: Any, request: Context, exc: Exception) -> None:
    """Celery's own errback call: a ``(request, exc, traceback)`` errback runs here, one that
    takes a task id is sent as a task."""
    try:
        app.backend._call_task_errbacks(request, exc, None)
    except Exception as error:
        log.warning("task %s's errbacks: %s", request.id, error)


_handed: dict[int, float] = {}  # run -> when its chains were last handed to a pool


def reap(
    store: HasChains,
    stall: float,
    settled_for: float,
    producer: Callable[[], Any] | None = None,
) -> int:
    """The reaper's step: finished runs whose chains no finalizer sent are handed to a
    worker's pool (the errbacks are user code), each at most once per ``stall`` seconds."""
    now = time.monotonic()
    for old in [r for r, at in _handed.items() if now - at > 10 * stall]:
        del _handed[old]
    handed = 0
    for run_id in store.runs.chained_finished(settled_for):
        if now - _handed.get(run_id, -math.inf) < stall:
            continue
        _handed[run_id] = now
        send_chains(run_id, producer() if producer is not None else None)
        handed += 1
        log.warning("reaper: run %s has ended; a worker sends the chains waiting for it", run_id)
    return handed
