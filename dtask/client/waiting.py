"""Why a run waits (``dtask status``, ``GET /api/v1/runs/{id}``, the dashboard): the store's
facts, what this machine sees of the workers' code files, and the domain's rule."""

from __future__ import annotations

import os
from dataclasses import replace

from dtask import services
from dtask.db import WorkerInfo
from dtask.domain.waiting import Waiting, explain


def why(run_id: int) -> Waiting | None:
    """The binding reason the run (or its next children) does not run now; None when nothing
    holds it. Raises RunNotFound."""
    within = services.current().settings.worker_seen_within
    facts, workers = services.store().waiting.facts(run_id, within)
    changed = {w.name: changed_files(w) for w in workers}
    seen = [replace(w, changed=changed.get(w.name, ())) for w in facts.workers]
    return explain(replace(facts, workers=seen))


def changed_files(worker: WorkerInfo) -> tuple[str, ...]:
    """The worker's template files that differ on this machine's disk from what it loaded
    (a file this machine cannot see is not judged)."""
    changed = []
    for path, loaded in (worker.code or {}).items():
        try:
            if os.stat(path).st_mtime_ns != loaded:
                changed.append(path)
        except OSError:
            continue
    return tuple(changed)
