"""The thin Celery tasks. Each is idempotent: any message may arrive twice.

master   pending -> splitting (children inserted once) -> running (chord sent)
child    claim under a lease with a fence, heartbeat, run from the checkpoint, finish
finalize (the chord callback, also its errback) marks the master from PostgreSQL's counts
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.context import ChildContext
from dtask.db import Claim, Redispatch, Refusal, RunRecord, Store
from dtask.exceptions import (
    ChildFailed,
    ChildStopped,
    DatabaseUnavailable,
    DtaskError,
    LeaseLost,
)
from dtask.runs import ChildState, ClaimRefusal, RunState
from dtask.settings import is_redis
from dtask.templates import registry
from dtask.worker import drain
from dtask.worker.app import app
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.heartbeat import Heartbeat

log = logging.getLogger("dtask.worker")

MASTER = "dtask.master"
CHILD = "dtask.child"
FINALIZE = "dtask.finalize"

T = TypeVar("T")


def owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_master(store: Store, run_id: int, wait: bool = True) -> RunState:
    """Split and dispatch ``run_id`` if that has not happened yet (the master task's body,
    also called by the reaper for stuck runs)."""
    max_children = services.current().settings.max_children

    def plan(run: RunRecord) -> list[dict[str, Any]]:
        return registry.get(run.template).plan(run.variables, max_children)

    state = store.split_run(run_id, plan, wait=wait)
    if state is RunState.SPLITTING:
        state = store.dispatch_run(run_id, send_chord, wait=wait)
    return state


@app.task(name=MASTER, bind=True, acks_late=True, ignore_result=True)
def master(self: Task, run_id: int) -> None:
    state = run_master(services.store(), run_id)
    log.info("run %s is %s", run_id, state.value)


def send_chord(run: RunRecord, children: list[tuple[int, dict[str, Any]]]) -> None:
    """Publish the children as the header of a Celery chord whose callback is ``finalize``.

    Deterministic task ids (``<group>.<index>``) and the chord options let anyone re-send a
    child later with the same identity, so the chord still completes exactly once.
    """
    assert run.group_id is not None and run.chord_size is not None
    app.backend.set_chord_size(run.group_id, run.chord_size)
    publish(
        (
            Redispatch(run.id, index, spec, run.template, run.group_id, run.queue)
            for index, spec in children
        ),
        priority=SMALL_RUN if run.chord_size <= SMALL_RUN_CHILDREN else LARGE_RUN,
    )


# Redis pops priority 0 first (and unprioritised messages count as 0). Masters, callbacks
# and re-sent children (failover, hand-over) go first; then the children of small runs, so a
# short job never waits behind a large one's backlog; then large runs' children, FIFO.
# RabbitMQ needs x-max-priority queues (and counts the other way): there everything is FIFO.
RESEND, SMALL_RUN, LARGE_RUN = 0, 3, 6
SMALL_RUN_CHILDREN = 100


def _priority(value: int) -> dict[str, int]:
    return {"priority": value} if is_redis(str(app.conf.broker_url)) else {}


def publish(children: Iterable[Redispatch], priority: int = RESEND) -> int:
    """Send child messages through one producer, pipelined where the broker allows (Redis);
    returns how many.

    Each message is the one ``child.apply_async`` would send (same headers, body and
    properties, built by Celery's ``create_task_message``) minus the per-call overhead that
    dominates a large chord: routing, queue declaration, publish signals and the ``task-sent``
    event per child, and one broker round trip each. A failed send raises; the children are
    in PostgreSQL, so the reaper re-sends them (the master's run stays ``splitting``).
    """
    sent = 0
    callbacks: dict[str, Any] = {}
    declared: dict[str, Any] = {}
    options = _priority(priority)
    parent = _parent_ids()
    with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
        for c in children:
            callback = callbacks.get(c.group_id)
            if callback is None:
                callback = callbacks[c.group_id] = chord_callback(c.run_id, c.group_id)
            name = c.queue or DEFAULT_QUEUE
            queue = declared.get(name)
            if queue is None:
                queue = declared[name] = app.amqp.queues[name]
                producer.maybe_declare(queue)
            headers, properties, body, _ = app.amqp.create_task_message(
                child_task_id(c.group_id, c.index),
                CHILD,
                (c.run_id, c.index, c.template, c.spec),
                None,
                group_id=c.group_id,
                group_index=c.index,
                chord=callback,
                reply_to=app.thread_oid,
                **parent,
                **readable(c.template, c.run_id, c.index, c.spec),
            )
            producer.publish(
                body,
                exchange="",  # what Celery does for a direct queue: route by its name
                routing_key=queue.name,
                serializer="json",
                delivery_mode=queue.exchange.delivery_mode,
                headers=headers,
                retry=False,
                **options,
                **properties,
            )
            sent += 1
    return sent


PUBLISH_BATCH = 1000


def _parent_ids() -> dict[str, Any]:
    """root_id/parent_id as apply_async sets them when a task (the master) sends."""
    parent = app.current_worker_task
    if parent is None:
        return {}
    return {"root_id": parent.request.root_id or parent.request.id, "parent_id": parent.request.id}


def readable(template: str, run_id: int, index: int, spec: dict[str, Any]) -> dict[str, str]:
    """How a child shows in Flower and the logs: "print_range run 5 child 3", its spec."""
    return {"argsrepr": f"{template} run {run_id} child {index}", "kwargsrepr": repr(spec)}


def chord_callback(run_id: int, group_id: str) -> Any:
    return finalize.si(run_id).set(
        task_id=f"{group_id}.finalize", link_error=[finalize.si(run_id)], queue=DEFAULT_QUEUE
    )


def child_task_id(group_id: str, index: int) -> str:
    return f"{group_id}.{index}"


def _patiently(call: Callable[[], T], patience: float) -> T:
    """Retry a write while PostgreSQL is unreachable (a restart), for up to ``patience`` s."""
    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return call()
        except DatabaseUnavailable:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


# track_started=False: a child's "running" lives in PostgreSQL (and Flower gets the
# task-started event either way); Celery's STARTED result would cost 3 Redis commands per child.
@app.task(name=CHILD, bind=True, acks_late=True, max_retries=None, track_started=False)
def child(self: Task, run_id: int, index: int, template: str, spec: dict[str, Any]) -> None:
    """Run one child. ``template`` and ``spec`` ride along for Flower; PostgreSQL is the truth."""
    config = services.current().settings
    drain.arm()
    try:
        store = services.store()
        if drain.DRAINING.is_set():  # this worker is stopping: let another one take it
            _hand_over(store, run_id, index, template, spec)
            raise Ignore()
        taken = _patiently(
            lambda: store.claim_child(run_id, index, owner_name(), config.lease_ttl),
            config.lease_ttl,
        )
        if isinstance(taken, Refusal):
            _refused(run_id, index, taken)
            return None
        _run_claimed(self, store, taken, run_id, index, template, spec)
    except LeaseLost as exc:
        log.warning("run %s child %s: %s", run_id, index, exc)
        raise Ignore() from None
    except DatabaseUnavailable as exc:
        # Nothing can be recorded now. Try again later: the lease runs out and the next
        # claim resumes from the last committed checkpoint. Not counted by the chord.
        log.warning("run %s child %s: %s; retrying in %g s", run_id, index, exc, config.lease_ttl)
        raise self.retry(countdown=config.lease_ttl, max_retries=None) from None
    return None


def _hand_over(store: Store, run_id: int, index: int, template: str, spec: dict[str, Any]) -> None:
    """Re-send a child this worker let go of, ahead of first-time children."""
    run = store.run(run_id)
    if run.state in (RunState.SPLITTING, RunState.RUNNING) and run.group_id is not None:
        publish([Redispatch(run_id, index, spec, template, run.group_id, run.queue)])


def _run_claimed(
    task: Task,
    store: Store,
    claim: Claim,
    run_id: int,
    index: int,
    template: str,
    spec: dict[str, Any],
) -> None:
    config = services.current().settings
    beat = Heartbeat(
        lambda: store.renew_lease(claim, config.lease_ttl),
        config.heartbeat_interval,
        name=f"{run_id}.{index}",
    )

    def release_and_hand_over() -> None:
        with contextlib.suppress(LeaseLost):
            store.release_child(claim, None)  # keeps the last committed checkpoint
        _hand_over(store, run_id, index, template, spec)

    drain.running(release_and_hand_over)
    try:
        with beat:
            tpl = registry.get(template)
            ctx = ChildContext(
                run_id=run_id,
                index=index,
                attempt=claim.attempt,
                checkpoint_state=claim.checkpoint,
                writer=lambda state: _patiently(
                    lambda: store.checkpoint(claim, state, config.lease_ttl), config.lease_ttl
                ),
                checkpoint_interval=tpl.options.checkpoint_interval or config.checkpoint_interval,
                checkpoint_every=tpl.options.checkpoint_every or config.checkpoint_every,
                lease_lost=beat.lost.is_set,
                stop_requested=lambda: beat.stop_requested.is_set() or drain.DRAINING.is_set(),
            )
            tpl.function(ctx, **claim.spec)
            if beat.lost.is_set():
                raise LeaseLost(f"run {run_id} child {index} was taken over elsewhere")
            _patiently(lambda: store.finish_child(claim, ctx.unsaved_checkpoint), config.lease_ttl)
    except (LeaseLost, DatabaseUnavailable):
        raise
    except ChildStopped:
        _patiently(lambda: store.release_child(claim, None), config.lease_ttl)
        if not beat.stop_requested.is_set():  # drained, not cancelled: resume elsewhere now
            _hand_over(store, run_id, index, template, spec)
        log.info("run %s child %s stopped at its checkpoint and was released", run_id, index)
        raise Ignore() from None
    except Exception as exc:
        reprs = readable(template, run_id, index, spec)
        _attempt_failed(task, store, claim, run_id, index, exc, config.retry_delay, reprs)
    finally:
        drain.running(None)


def _refused(run_id: int, index: int, refusal: Refusal) -> None:
    if refusal.reason is ClaimRefusal.DONE:
        return  # same id, state and result as the first report: the chord counts it once
    if refusal.reason is ClaimRefusal.FAILED:
        raise ChildFailed(refusal.error or "failed")
    # BUSY: a duplicate while another owner holds the lease (the reaper re-sends the child
    # if that owner dies); INACTIVE: the run was cancelled; GONE: the run was deleted.
    log.info("run %s child %s: not started (%s)", run_id, index, refusal.reason.value)
    raise Ignore()


def _attempt_failed(
    task: Task,
    store: Store,
    claim: Claim,
    run_id: int,
    index: int,
    exc: Exception,
    delay: float,
    reprs: dict[str, str],
) -> None:
    error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DtaskError) else str(exc)
    state = store.fail_attempt(claim, error)
    if state is ChildState.FAILED:
        log.error("run %s child %s failed for good: %s", run_id, index, error)
        raise ChildFailed(store.child_error(run_id, index) or error) from exc
    log.warning(
        "run %s child %s attempt %s/%s failed, retrying from its checkpoint: %s",
        run_id, index, claim.attempt, claim.max_attempts, error,
    )  # fmt: skip
    raise task.retry(countdown=delay, max_retries=None, exc=exc, **reprs)


@app.task(name=FINALIZE, acks_late=True, ignore_result=True)
def finalize(run_id: int) -> None:
    state = services.store().finalize_run(run_id)
    log.info("run %s finalized: %s", run_id, state.value)
