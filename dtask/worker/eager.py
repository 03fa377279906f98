"""Test mode: a submit runs its run in its own process before it returns; nothing goes to the
broker (a test may run without one).

On with DTASK_EAGER=1 (``CELERY_DTASK_EAGER = True`` in a Django project's settings, like
every dtask setting) or Celery's ``task_always_eager`` (``CELERY_TASK_ALWAYS_EAGER``). The run
is created as any submit creates it (the same checks: variables, split size, client, key),
then goes through the worker's own code, called here instead of through messages: the
master's split (``run_master``, its children handed back instead of sent), each child in
index order through a child's path (``Received``: claim, lease and heartbeats,
``ctx.resume`` checkpoints, the execution cap, its result; a failed attempt is tried again at
once, as Celery's eager retry is, until the template's attempts are spent) and the finalize
(the template's reduce, the run's result or its failure). So ``template.delay(...)`` returns a
run already finished, and ``Run.get()`` its result or RunFailed with its error.

Where Django is set up and its ``default`` database is PostgreSQL, dtask keeps its tables in
that database (under ``manage.py test``: the test database, its dtask tables created on first
use), not in dtask's configured one; elsewhere in dtask's. Either way through connections
opened per transaction and closed after it, so the test runner can drop its database. Django
code in a child runs in the test's thread, on the test's connection (inside a ``TestCase``'s
transaction); dtask's own rows are written by dtask's connections and are not rolled back
with the test.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, NoReturn

from celery.exceptions import Ignore

from dtask import services
from dtask.db import RunRecord, Store
from dtask.db.callers import django_url, unpooled_store
from dtask.db.engine import Limits
from dtask.domain.runs import RunState
from dtask.domain.templates import registry
from dtask.exceptions import ChildFailed, DatabaseUnavailable
from dtask.worker.app import current

log = logging.getLogger("dtask.worker")


_engaged: services.Services | None = None  # test mode by the Celery app's flag, at a submit


def active() -> bool:
    """Whether runs execute in this process (DTASK_EAGER, or the Celery app's
    ``task_always_eager``), asked at each submit."""
    global _engaged
    services.refuse_mixed()  # before current() starts anything embedded for it
    resolved = services.current()
    on = resolved.settings.eager or bool(current().conf.task_always_eager)
    _engaged = resolved if on else None
    return on


def _store(resolved: services.Services) -> Store | None:
    """Test mode's store (``services.store()`` returns it): Django's default database where it
    is PostgreSQL, else dtask's; no connection kept between transactions; no chords. Asked on
    every ``services.store()``, so it reads no Celery setting: DTASK_EAGER, or the Celery
    flag as the latest submit found it (a few µs a call less on a worker's hot path)."""
    if not (resolved.settings.eager or _engaged is resolved):
        return None
    url = _django_database() or resolved.database_url
    return unpooled_store(url, Limits.of(resolved.settings))


def _django_database() -> str | None:
    if "django" not in sys.modules:
        return None
    from django.conf import settings  # type: ignore[import-untyped]

    if not settings.configured:
        return None
    from django.db import connections  # type: ignore[import-untyped]

    return django_url(connections["default"].settings_dict)


services.use_store(_store)


class _Again(Exception):
    """The child's message would be tried again: here, at once."""

    def __init__(self, exc: BaseException | None) -> None:
        super().__init__(str(exc))
        self.exc = exc


def run(run_id: int) -> RunState:
    """Split the run, run each of its children here, finalize it: its final state (or its
    state where it could not start: waiting for upstream runs, or failed at its split)."""
    # the worker's modules, loaded only where runs execute in process: a submit needs none
    from dtask.worker.finalize import finalize_run
    from dtask.worker.tasks import run_master

    store = services.store()
    children: list[tuple[int, dict[str, Any]]] = []

    def keep(run: RunRecord, sent: list[tuple[int, dict[str, Any]]]) -> None:
        children.extend(sent)

    state = run_master(store, run_id, send=keep)
    if state is not RunState.RUNNING:
        return state
    template = store.runs.get(run_id).template
    for index, spec in children:
        _run_child(run_id, index, template, spec)
    state = finalize_run(store, run_id, chord=False)
    log.info("run %s ran eagerly: %s", run_id, state.value)
    return state


def _run_child(run_id: int, index: int, template: str, spec: dict[str, Any]) -> None:
    from dtask.worker.child_store import Child
    from dtask.worker.received import Received

    class InProcess(Received):
        """The in-process stand-in of a child's message: a retry runs it again at once; the
        run is finalized once its children have all run."""

        def retry(
            self, child: Child, countdown: float, exc: BaseException | None = None
        ) -> NoReturn:
            self.retries += 1
            raise _Again(exc)

        def finalize(self, child: Child) -> None:
            pass

    delivery = InProcess([Child(run_id, index, template, spec)])
    tries = 2 * registry.get(template).options.max_attempts + 2  # bounds a refusal's loop
    while True:
        try:
            delivery.run()
            return
        except _Again as again:
            if isinstance(again.exc, DatabaseUnavailable):
                raise again.exc from None
            if delivery.retries >= tries:
                log.error("run %s child %s: not run after %s tries", run_id, index, tries)
                return
        except (Ignore, ChildFailed):  # refused, or failed for good: PostgreSQL holds it
            return
