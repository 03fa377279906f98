"""Scoped policy: dtask's worker side applies to workers of the app dtask sends through.

``dtask.init_app(app)`` connects to Celery's signals, which are global: they fire for a worker
of any app the process runs, a second, plain Celery app of the same package too (``celery -A
proj.other worker`` imports ``proj``, which adopts ``proj``'s app). Each of dtask's worker-side
handlers asks first, so such a worker stays stock Celery: no prefetch refusal, no connection
budget, no loops (reaper, dispatcher, notifier, monitor, registry, batched events), no
hand-over on SIGTERM (invariant 15)."""

from __future__ import annotations

import weakref
from typing import Any

from celery import Celery

from dtask.worker.app import current

CELERY_DEFAULT_PREFETCH = 4
_worker_app: Any = None  # the app of this process's worker, from its celeryd_init
lowered: weakref.WeakSet[Celery] = weakref.WeakSet()  # adopted apps whose default 4 became 1


def serves(app: Any) -> bool:
    """Whether a worker of ``app`` is dtask's: the app ``dtask.init_app`` was given (or, under
    ``dtask worker``, dtask's own). None (a sender that names no app): this process's worker."""
    return this_worker() if app is None else app is current()


def starting(app: Any) -> bool:
    """Note the app of this process's worker as it starts (``celeryd_init``, in its main
    process, before the pool forks); whether it is dtask's."""
    global _worker_app
    _worker_app = app
    return serves(app)


def this_worker() -> bool:
    """Whether this process's worker (its main process, or a pool process forked from it) is
    dtask's. A worker that never announced its start (a bare ``WorkController``) counts as one,
    as before policy was scoped."""
    return _worker_app is None or serves(_worker_app)
