"""A run's result, from its template's ``reduce``, for whoever finalizes it (the last child,
the chord callback, the reaper, a revoke)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dtask import services
from dtask.db import RunRecord, Store
from dtask.domain.results import reduced
from dtask.domain.runs import RunState
from dtask.domain.templates import registry
from dtask.worker.dispatch import send_master

log = logging.getLogger("dtask.worker")


def reducer(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
    """The run's result as JSON text (None without a reduce). UnknownTemplate where this
    process does not know the template: the run is left to one that does."""
    tpl = registry.get(run.template)
    if tpl.reduce is None:
        return None
    return reduced(tpl.reduce, load(), tpl.name, services.current().settings.max_run_result)


def finalize_run(
    store: Store, run_id: int, wait: bool = True, producer: Callable[[], Any] | None = None
) -> RunState:
    """Finalize the run with its template's reduce (every finalizer goes through here), then
    wake the masters of the dependents its success released."""
    released: list[int] = []
    state = store.runs.finalize(run_id, wait=wait, reduce=reducer, released=released)
    start_released(run_id, released, producer)
    return state


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
