"""A run's end: its result from its template's ``reduce``, for whoever finalizes it (the last
child, the chord callback, the reaper, a revoke)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from celery.signals import task_postrun
from redis.exceptions import ResponseError

from dtask import services
from dtask.db import RunRecord
from dtask.db.runs import Reducer
from dtask.domain.results import reduced
from dtask.domain.runs import RunState
from dtask.domain.templates import registry
from dtask.worker import chains, traces
from dtask.worker.messages import LATE_PARTS_IGNORED, forget_chord, send_master, sweep_late_part
from dtask.worker.task_table import CHILD

log = logging.getLogger("dtask.worker")


def reducer(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
    """The run's result as JSON text (None without a reduce). UnknownTemplate where this
    process does not know the template: the run is left to one that does."""
    tpl = registry.get(run.template)
    if tpl.reduce is None:
        return None
    return reduced(tpl.reduce, load(), tpl.name, services.current().settings.max_run_result)


class Finalizes(Protocol):
    def get(self, run_id: int) -> RunRecord: ...
    def terminating(self, run_id: int) -> bool: ...
    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = ...,
    ) -> RunState: ...


class FinalizingStore(Protocol):
    @property
    def runs(self) -> Finalizes: ...


class Unfinished(Protocol):
    def any_unfinished(self, run_id: int) -> bool: ...


class LastChildStore(FinalizingStore, Protocol):
    @property
    def children(self) -> Unfinished: ...


@traces.finalize
def finalize_run(
    store: FinalizingStore,
    run_id: int,
    wait: bool = True,
    producer: Callable[[], Any] | None = None,
    chord: bool = True,
) -> RunState:
    """Finalize the run with its template's reduce (every finalizer goes through here), wake
    the masters of the dependents its success released, and drop what Celery's result
    backend still keeps of the run's chord (once, by the call that ended it): its done
    marker turns the parts still to return (the last child's own, a batch's) into no-ops.
    ``chord=False``: the run's children sent no message (a child run by its master). The
    Celery chains waiting for the run it ended go on (``dtask.worker.chains``)."""
    released: list[int] = []
    ended: list[str] = []
    state = store.runs.finalize(
        run_id, wait, reducer, released, ended if chord else None, reduces=runs_user_code
    )
    if state.finished:
        chains.after_finish(services.store(), run_id, producer)
    start_released(run_id, released, producer)
    for group in ended:
        forget(run_id, group)
    return state


def forget_run(store: FinalizingStore, run_id: int) -> None:
    """``forget`` for a run ended elsewhere (cancelled): its chord is the one it has now."""
    try:
        group = store.runs.get(run_id).group_id
    except Exception as exc:
        log.warning("run %s: its chord's keys in the result backend stay: %s", run_id, exc)
        return
    if group is not None:
        forget(run_id, group)


def forget(run_id: int, group: str) -> None:
    try:
        forget_chord(group)
    except Exception as exc:  # they expire by themselves (result_expires)
        log.warning("run %s: its chord's keys in the result backend stay: %s", run_id, exc)


def install() -> None:
    """Celery before 5.7 counts a chord part that returns after its run was finalized (the
    failed last child's own, a child finishing at a cancel): a child's task then sweeps what
    that part wrote (``sweep_late_part``). From a worker's main process, before its pool
    forks; nothing to do from Celery 5.7 on."""
    if not LATE_PARTS_IGNORED:
        task_postrun.connect(_after_part, weak=False)


_sweeps = True  # until a sweep fails (a Redis that runs no script): then said once


def _after_part(sender: Any = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    global _sweeps
    if getattr(sender, "name", None) != CHILD or state not in ("SUCCESS", "FAILURE"):
        return  # not a chord part: ignored, retried, or not dtask's
    request = getattr(task, "request", None)
    group = getattr(request, "group", None)
    if not _sweeps or not group or not getattr(request, "chord", None):
        return
    try:
        sweep_late_part(group)
    except ResponseError as exc:  # refused, not lost: their keys expire with result_expires
        _sweeps = False
        log.warning("late chord parts are not swept in this process: %s", exc)
    except Exception as exc:  # Redis away: the part itself met it too
        log.debug("chord %s: a late part not swept: %s", group, exc)


def start_released(
    upstream: int | None, released: list[int], producer: Callable[[], Any] | None = None
) -> None:
    """Send the masters of runs whose upstreams have all succeeded (committed as pending: one
    that cannot be sent now is started by the reaper's stuck-run step), through
    ``producer()`` if given, else a producer from the app's pool."""
    for run_id in released:
        try:
            send_master(run_id, through=producer() if producer is not None else None)
        except Exception as exc:  # a broker error included: the run is pending, safe to leave
            log.warning("run %s: released, its master not sent (the reaper will): %s", run_id, exc)
        else:
            after = f" after run {upstream}" if upstream is not None else ""
            log.info("run %s released%s: its upstreams all succeeded", run_id, after)


def runs_user_code(template: str) -> bool:
    """Whether finalizing a run of ``template`` would run user code here (its reduce), or
    cannot be done here (the template is unknown to this process)."""
    return template not in registry or registry.get(template).reduce is not None


def finalize_if_last(store: LastChildStore, run_id: int) -> None:
    """The run's last child to finish finalizes it from PostgreSQL's counts, whatever the
    result backend (a chord callback, where there is one, then finds it done). A failure is
    left to the chord callback or the reaper."""
    try:
        if not store.children.any_unfinished(run_id):
            state = finalize_run(store, run_id)
            log.info("run %s finalized by its last child: %s", run_id, state.value)
    except Exception as exc:  # the child itself succeeded: never fail it for this
        log.warning("run %s: not finalized by its last child (the reaper will): %s", run_id, exc)
