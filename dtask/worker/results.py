"""A run's result, from its template's ``reduce``, for whoever finalizes it (the last child,
the chord callback, the reaper, a revoke)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtask import services
from dtask.db import RunRecord
from dtask.domain.results import reduced
from dtask.domain.templates import registry


def reducer(run: RunRecord, load: Callable[[], list[Any]]) -> str | None:
    """The run's result as JSON text (None without a reduce). UnknownTemplate where this
    process does not know the template: the run is left to one that does."""
    tpl = registry.get(run.template)
    if tpl.reduce is None:
        return None
    return reduced(tpl.reduce, load(), tpl.name, services.current().settings.max_run_result)
