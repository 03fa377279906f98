"""The thin Celery tasks. Each is idempotent: any message may arrive twice.

master   pending -> splitting (children inserted once) -> running (chord sent); a run of one
         child nothing competes with: its child taken at the split and run inline
child    one child's lifecycle (dtask/worker/lifecycle.py)
finalize (the chord callback, also its errback) marks the master from PostgreSQL's counts
submit   a run from a Celery signature; in a chain, the rest of it waits for the run
chains   the chains waiting for a run that ended, sent by a pool process (dtask/worker/chains.py)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.db import RunRecord, Store
from dtask.db.inline import Inline
from dtask.db.workers import LiveSlots
from dtask.domain.dispatch import BATCH_SECONDS, batch_size
from dtask.domain.runs import RunState
from dtask.domain.templates import launcher, registry
from dtask.exceptions import (
    DatabaseUnavailable,
    InvalidVariables,
    UnknownTemplate,
)
from dtask.settings import Settings
from dtask.worker import chains, dispatcher, drain, links, task_table, traces
from dtask.worker.app import app
from dtask.worker.child_store import Child, owner_name
from dtask.worker.finalize import finalize_run
from dtask.worker.inline_runs import child_seconds, run_inline, run_many, together
from dtask.worker.masters import PER_MESSAGE, Master, send_masters
from dtask.worker.messages import TEMPLATE_HEADER, readable, send_chord, send_master
from dtask.worker.received import Received, note_time, noted, template_backoff
from dtask.worker.task_table import CHAINS, CHILD, FINALIZE, MASTER, MASTERS, SUBMIT
from dtask.worker.time_limit import time_limit

log = logging.getLogger("dtask.worker")


def dtask_task(name: str) -> Callable[[Callable[..., Any]], Any]:
    """The task ``name`` (options from dtask/worker/task_table.py) on dtask's own app (and, as
    Celery's ``shared`` tasks are, on every app finalized later); a host app gets it through
    the table's entry."""

    def decorate(function: Callable[..., Any]) -> Any:
        task_table.implements(name, function)
        return app.task(**task_table.options(name))(function)

    return decorate


class TemplateElsewhere(Exception):
    """This worker cannot load the run's template; another worker may (a rolling deploy)."""


class NotDue(Exception):
    """The run's countdown or eta has not passed yet."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"starts in {seconds:.1f} s")
        self.seconds = seconds


def template_wait(settings: Settings) -> float:
    """How long a run's master is left to workers that know its template before it fails."""
    return 4 * settings.stall_timeout


@traces.master
def run_master(
    store: Store,
    run_id: int,
    wait: bool = True,
    inline: list[Child] | None = None,
    send: Callable[[RunRecord, list[tuple[int, dict[str, Any]]]], None] | None = None,
) -> RunState:
    """Split and dispatch ``run_id`` if that has not happened yet (the master task's body).
    Raises TemplateElsewhere, leaving the run pending, when this worker does not know the
    template and others may still take it. With ``inline``, a run of one child the dispatcher
    would send at once is not sent: ``inline`` gets its child, for the caller to run. With
    ``send``, the children go to it instead of the broker (test mode: dtask/worker/eager.py)."""
    settings = services.current().settings
    planned: list[int] = []

    def plan(run: RunRecord, slots: LiveSlots) -> list[str]:
        try:
            template = registry.get(run.template)
        except UnknownTemplate as exc:
            bound = template_wait(settings)
            if run.idle < bound:
                raise TemplateElsewhere(str(exc)) from None
            raise UnknownTemplate(
                f"no worker that took run {run.id} knows template {run.template!r} (tried for"
                f" {bound:g} s; load it on the workers with DTASK_TEMPLATES)"
            ) from None
        with time_limit(settings.split_timeout, f"the split of template {template.name!r}"):
            specs = template.plan(
                run.variables,
                settings.max_children,
                settings.max_child_spec,
                slots=partial(slots, settings.worker_seen_within),
            )
        planned.append(len(specs))
        return specs

    deferred = send is None and settings.dispatch == "window"  # the dispatcher sends them
    # an operator's DTASK_DISPATCH_WINDOW bounds every child out: none runs past it inline
    offer = None
    if inline is not None and settings.dispatch_window is None:
        offer = Inline(owner_name(), settings.lease_ttl)
    state = store.runs.split(run_id, plan, wait=wait, deferred=deferred, offer=offer)
    if inline is not None and offer is not None:
        inline.extend(Child(run_id, i, offer.template, c.spec, c) for i, c in offer.taken)
    if state is RunState.PENDING:
        starts_in = store.runs.get(run_id).starts_in
        if starts_in > 0:
            raise NotDue(starts_in)
    if state is RunState.SPLITTING:
        state = store.runs.dispatch(run_id, send or send_chord, wait=wait, deferred=deferred)
        if deferred and state is RunState.RUNNING:
            dispatcher.nudge()
        store.runs.refresh_statistics(sum(planned))  # the first children are on their way
    return state


@dtask_task(MASTER)
def master(self: Task, run_id: int) -> None:
    """The run's master. Where its message names the run's template (``TEMPLATE_HEADER``)
    and this process has run one-child runs of it, a run of one child is taken in two
    statements, with as many pending runs of its template and priority as their children
    fill BATCH_SECONDS by this process's count (``inline_runs.run_many``)."""
    drain.arm()  # before the split: a stopping worker's SIGTERM then hands its child over
    try:
        _master(self, run_id)
    finally:
        drain.finished()  # a process that got SIGTERM takes no further work


def _master(self: Task, run_id: int) -> None:
    template = _header(self, TEMPLATE_HEADER)
    seen = None if template is None else child_seconds(template)
    if (
        template is not None
        and seen is not None
        and together(template)
        and not run_many(services.store(), [run_id], batch_size(seen) - 1)
    ):
        return  # taken (and run), or split already
    inline: list[Child] = []
    try:
        state = run_master(services.store(), run_id, inline=inline)
    except TemplateElsewhere as exc:
        if not self.request.retries:
            log.warning("run %s: %s; leaving its master to another worker", run_id, exc)
        raise self.retry(
            countdown=template_backoff(self.request.retries), max_retries=None
        ) from None
    except NotDue as early:  # a duplicate or early message: wake again when it is due
        raise self.retry(countdown=early.seconds, max_retries=None) from None
    _split(services.store(), run_id, state, inline)


def _header(task: Task, name: str) -> str | None:
    """A custom header of the task's message: a worker's request holds it among its own
    fields, an in-process ``apply``'s in ``headers``."""
    value = task.request.get(name) or (task.request.headers or {}).get(name)
    return value if isinstance(value, str) else None


def _split(store: Store, run_id: int, state: RunState, inline: list[Child]) -> None:
    """A master's run after its split: a failed split's chains told, its child run here."""
    log.info("run %s is %s", run_id, state.value)
    if state.finished:  # its split failed: a chain waiting for it fails with its error
        chains.after_finish(store, run_id)
    run_inline(inline)


# A dtask.masters message's wall time, at most: where each run's own bookkeeping is slow (a
# busy database), the rest go back sooner than their children's time alone would say.
MESSAGE_SECONDS = 10 * BATCH_SECONDS


@dtask_task(MASTERS)
def masters(self: Task, template: str, priority: int, run_ids: list[int]) -> None:
    """The masters of several runs of ``template`` (a bulk submit's): as many as the
    template's children fill BATCH_SECONDS by the time this process has seen them take (their
    function's, as a message of children is sized); the rest go back to the queue as a
    message of their own, for any process to take. Where this process has not yet seen the
    template's children take less than BATCH_SECONDS, it runs the first run alone and sends
    the others back at once: a long child never holds the rest. Runs of one child that start
    at once are taken together and run here (``inline_runs.run_many``); the others, each as
    ``master`` runs one, one after another within MESSAGE_SECONDS."""
    drain.arm()
    try:
        _masters(self, template, priority, [int(i) for i in run_ids])
    finally:
        drain.finished()  # a process that got SIGTERM takes no further work


def _masters(self: Task, template: str, priority: int, ids: list[int]) -> None:
    store = services.store()
    seen = child_seconds(template)
    here = 1 if seen is None else batch_size(seen)
    if len(ids) > here:
        ids = store.runs.unsplit(ids)  # a cancelled or finished run has no master to run
    if len(ids) > here:
        _send_back(template, priority, ids[here:])
        ids = ids[:here]
    if together(template):
        ids = run_many(store, ids)
    began = time.monotonic()
    for position, run_id in enumerate(ids):
        if position and (drain.draining() or time.monotonic() - began >= MESSAGE_SECONDS):
            _send_back(template, priority, ids[position:])
            return
        inline: list[Child] = []
        try:
            state = run_master(store, run_id, inline=inline)
        except TemplateElsewhere as exc:
            if not self.request.retries:
                log.warning("runs %s: %s; leaving them to another worker", ids[position:], exc)
            raise self.retry(
                args=(template, priority, ids[position:]),
                countdown=template_backoff(self.request.retries),
                max_retries=None,
            ) from None
        except NotDue as early:  # rerun meanwhile with a countdown: its own master, when due
            send_master(run_id, countdown=early.seconds, priority=priority, template=template)
            continue
        _split(store, run_id, state, inline)


def _send_back(template: str, priority: int, run_ids: list[int]) -> None:
    """Runs of a ``dtask.masters`` message not run here, back to the queue (BrokerUnavailable:
    they stay pending, and the reaper sends their masters once overdue)."""
    back = [Master(i, template, priority, shown=f"{template} run {i}") for i in run_ids]
    send_masters(back, PER_MESSAGE)


@dtask_task(SUBMIT)
def submit_run(
    self: Task,
    *previous: Any,
    template: str,
    variables: dict[str, Any],
    key: str | None = None,
) -> int:
    """A run started by a Celery signature (``Template.s``/``si``: a chain, a canvas, a beat
    entry): its id. In a chain the previous result, if a dict, adds variables; what follows
    it in the chain (and its ``link`` / ``link_error``) waits for the run to finish and gets
    the run's result, or fails with its error (``dtask.worker.chains``)."""
    given = dict(variables)
    if previous:
        upstream = previous[0]
        if isinstance(upstream, dict):
            given = {**upstream, **given}
        elif upstream is not None:
            raise InvalidVariables(
                f"template {template!r} got {upstream!r} from the previous task: a chain passes"
                " a dict of variables (or use .si() to ignore it)"
            )
    run_id: int = launcher().submit(template, given, key=key).id
    chains.take_over(self, services.store(), run_id)
    return run_id


@dtask_task(CHAINS)
def continue_chains(run_id: int) -> None:
    """The chains waiting for a run that ended, sent by a pool process (asked by the reaper,
    or by a finalize outside a task): a failed run's errbacks are user code."""
    if chains.continue_chains(services.store(), run_id):
        log.info("run %s: its chains were sent", run_id)


class OwnMessage(Received):
    """A ``dtask.child`` message: one child, tried again as Celery retries its task; its
    time noted for the dispatcher now and then (``noted``)."""

    def __init__(
        self, task: Task, run_id: int, index: int, template: str, spec: dict[str, Any]
    ) -> None:
        super().__init__([Child(run_id, index, template, spec)])
        self.task = task
        self.reprs = readable(template, run_id, index, spec)

    @property
    def retries(self) -> int:  # type: ignore[override]
        return int(self.task.request.retries or 0)

    def retry(self, child: Child, countdown: float, exc: BaseException | None = None) -> NoReturn:
        raise self.task.retry(countdown=countdown, max_retries=None, exc=exc, **self.reprs)

    def elsewhere(self, countdown: float) -> NoReturn:
        self.retry(self.children[0], countdown)

    def hand_back(self, rest: list[Child], countdown: float | None = None) -> None:
        """A drain's: where PostgreSQL cannot say whether the run is active, the message is
        tried again once a lease could have run out, as a child that met it would be."""
        try:
            super().hand_back(rest, countdown)
        except DatabaseUnavailable as exc:
            links.cut_off()
            ttl = services.current().settings.lease_ttl
            log.warning("%s: not handed over: %s; retrying in %g s", rest[0], exc, ttl)
            self.retry(rest[0], ttl)
        raise Ignore()

    def ended(self, child: Child) -> None:
        _ended_for_flower(self.task)

    def ended_all(self) -> None:
        child = self.children[0]
        if self.took and noted(child.index):
            note_time(child.run_id, self.took[0])


# track_started=False: a child's "running" lives in PostgreSQL (and Flower gets the
# task-started event either way); Celery's STARTED result would cost 3 Redis commands per child.
@dtask_task(CHILD)
@traces.child
def child(self: Task, run_id: int, index: int, template: str, spec: dict[str, Any]) -> None:
    """Run one child. ``template`` and ``spec`` ride along for Flower; PostgreSQL is the truth."""
    drain.arm()
    try:
        OwnMessage(self, run_id, index, template, spec).run()
    finally:
        drain.finished()  # a process that got SIGTERM takes no further work


def _ended_for_flower(task: Task) -> None:
    """An ignored task sends no final event: Flower would show it STARTED for ever. A child
    that ends because its run was cancelled is ``REVOKED`` there (as a revoke would be)."""
    try:
        if task.app.conf.worker_send_task_events:
            task.send_event("task-revoked", terminated=False, signum=None, expired=False)
    except Exception as exc:  # monitoring only: never fail the child for it
        log.debug("could not send task-revoked: %s", exc)


@dtask_task(FINALIZE)
def finalize(run_id: int) -> None:
    state = finalize_run(services.store(), run_id)
    log.info("run %s finalized: %s", run_id, state.value)
