"""What Celery's ``revoke`` means for dtask's tasks (the worker's main process sees it).

Revoking a child's task id (``app.control.revoke(id)``, with or without ``terminate=True``) is
the user asking that child to stop for good: the child is ``failed`` with an error that says
so, whatever owner or fence it has, and the run fails once its other children have finished.
Without this a revoked child kept its row unfinished while every re-sent copy of its message
was discarded as revoked: the run stayed ``running`` for ever. Revoking a ``dtask.children``
message (several short children, one task in Flower) fails each of its children that has not
finished, the same way. Revoking a master's task id
cancels its run. Revoking ``finalize`` changes nothing: the reaper finalizes a run whose
callback never ran.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import task_revoked

from dtask import services
from dtask.domain.runs import RunState
from dtask.worker.finalize import finalize_run, forget_run
from dtask.worker.task_table import CHILD, CHILDREN, MASTER, MASTERS

log = logging.getLogger("dtask.worker")


def _on_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    name = getattr(sender, "name", None)
    args = list(getattr(request, "args", None) or ())
    try:
        if name == CHILD and len(args) >= 2:
            run_id, index = int(args[0]), int(args[1])
            how = "revoked and terminated" if terminated else "revoked"
            error = f"run {run_id} child {index} was {how} through Celery (task {request.id})"
            store = services.store()
            if store.children.revoke(run_id, index, error):
                log.warning("%s: the child failed", error)
            finalize_run(store, run_id, wait=False)
        elif name == CHILDREN and len(args) >= 5:
            run_id, indexes = int(args[0]), [int(i) for i, _ in args[4]]
            how = "revoked and terminated" if terminated else "revoked"
            store = services.store()
            failed = [
                i
                for i in indexes
                if store.children.revoke(
                    run_id,
                    i,
                    f"run {run_id} child {i}: its message was {how} through Celery"
                    f" (task {request.id})",
                )
            ]
            log.warning(
                "run %s: message %s %s through Celery: %d of its %d children failed",
                run_id, request.id, how, len(failed), len(indexes),
            )  # fmt: skip
            finalize_run(store, run_id, wait=False)
        elif (name == MASTER and args) or (name == MASTERS and len(args) >= 3):
            store = services.store()
            for run_id in [int(args[0])] if name == MASTER else [int(i) for i in args[2]]:
                log.warning("run %s: its master was revoked through Celery: cancelling it", run_id)
                if store.runs.cancel(run_id) is RunState.CANCELLED:
                    forget_run(store, run_id)
    except Exception:  # a revoke must never break the worker's consumer
        log.exception("handling the revoke of %s %s failed", name, getattr(request, "id", "?"))


task_revoked.connect(_on_revoked, weak=False)
