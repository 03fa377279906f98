"""A run's result, from its template's ``reduce``, for whoever finalizes it (the last child,
the chord callback, the reaper, a revoke)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtask import services
from dtask.db import RunRecord, Store
from dtask.domain.results import reduced
from dtask.domain.runs import RunState
from dtask.domain.templates import registry


def reducer(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
    """The run's result as JSON text (None without a reduce). UnknownTemplate where this
    process does not know the template: the run is left to one that does."""
    tpl = registry.get(run.template)
    if tpl.reduce is None:
        return None
    return reduced(tpl.reduce, load(), tpl.name, services.current().settings.max_run_result)


def finalize_run(store: Store, run_id: int, wait: bool = True) -> RunState:
    """Finalize the run with its template's reduce (every finalizer goes through here)."""
    return store.runs.finalize(run_id, wait=wait, reduce=reducer)


def runs_user_code(template: str) -> bool:
    """Whether finalizing a run of ``template`` would run user code here (its reduce), or
    cannot be done here (the template is unknown to this process)."""
    return template not in registry or registry.get(template).reduce is not None
