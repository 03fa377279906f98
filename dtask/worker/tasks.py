"""The thin Celery tasks. Each is idempotent: any message may arrive twice.

master   pending -> splitting (children inserted once) -> running (chord sent)
child    claim under a lease with a fence, run from the checkpoint, finish under the fence
finalize (the chord callback, also its errback) marks the master from PostgreSQL's counts
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from celery import Task
from celery.exceptions import Ignore

from dtask import services
from dtask.context import ChildContext
from dtask.db import Claim, Refusal, RunRecord, Store
from dtask.exceptions import ChildFailed, DtaskError, LeaseLost
from dtask.runs import ChildState, ClaimRefusal
from dtask.templates import registry
from dtask.worker.app import app
from dtask.worker.config import DEFAULT_QUEUE

log = logging.getLogger("dtask.worker")

MASTER = "dtask.master"
CHILD = "dtask.child"
FINALIZE = "dtask.finalize"


def _store() -> Store:
    return services.store()


def owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@app.task(name=MASTER, bind=True, acks_late=True, ignore_result=True)
def master(self: Task, run_id: int) -> None:
    store = _store()
    max_children = services.current().settings.max_children

    def plan(run: RunRecord) -> list[dict[str, Any]]:
        return registry.get(run.template).plan(run.variables, max_children)

    state = store.split_run(run_id, plan)
    if state.value == "splitting":
        state = store.dispatch_run(run_id, send_chord)
    log.info("run %s is %s", run_id, state.value)


def send_chord(run: RunRecord, group_id: str, children: list[tuple[int, dict[str, Any]]]) -> None:
    """Publish the children as the header of a Celery chord whose callback is ``finalize``.

    Deterministic task ids (``<group>.<index>``) and the chord options let anyone re-send a
    child later with the same identity, so the chord still completes exactly once.
    """
    assert run.child_total is not None
    callback = chord_callback(run.id, group_id)
    app.backend.set_chord_size(group_id, run.child_total)
    queue = run.queue or DEFAULT_QUEUE
    with app.producer_or_acquire() as producer:
        for index, spec in children:
            child.apply_async(
                args=(run.id, index, run.template, spec),
                task_id=child_task_id(group_id, index),
                group_id=group_id,
                group_index=index,
                chord=callback,
                queue=queue,
                producer=producer,
                add_to_parent=False,
            )


def chord_callback(run_id: int, group_id: str) -> Any:
    return finalize.si(run_id).set(
        task_id=f"{group_id}.finalize", link_error=[finalize.si(run_id)], queue=DEFAULT_QUEUE
    )


def child_task_id(group_id: str, index: int) -> str:
    return f"{group_id}.{index}"


@app.task(name=CHILD, bind=True, acks_late=True, max_retries=None)
def child(self: Task, run_id: int, index: int, template: str, spec: dict[str, Any]) -> None:
    """Run one child. ``template`` and ``spec`` ride along for Flower; PostgreSQL is the truth."""
    store = _store()
    config = services.current().settings
    taken = store.claim_child(run_id, index, owner_name(), config.lease_ttl)
    if isinstance(taken, Refusal):
        _refused(self, run_id, index, taken)
        return None
    claim = taken
    try:
        tpl = registry.get(template)
        ctx = ChildContext(
            run_id=run_id,
            index=index,
            attempt=claim.attempt,
            checkpoint_state=claim.checkpoint,
            writer=lambda state: store.checkpoint(claim, state, config.lease_ttl),
            checkpoint_interval=tpl.options.checkpoint_interval or config.checkpoint_interval,
            checkpoint_every=tpl.options.checkpoint_every or config.checkpoint_every,
        )
        tpl.function(ctx, **claim.spec)
        store.finish_child(claim, ctx.unsaved_checkpoint)
    except LeaseLost as exc:
        log.warning("run %s child %s: %s", run_id, index, exc)
        raise Ignore() from None
    except Exception as exc:
        _attempt_failed(self, store, claim, run_id, index, exc, config.retry_delay)
    return None


def _refused(task: Task, run_id: int, index: int, refusal: Refusal) -> None:
    if refusal.reason is ClaimRefusal.DONE:
        return  # same id, state and result as the first report: the chord counts it once
    if refusal.reason is ClaimRefusal.FAILED:
        raise ChildFailed(refusal.error or "failed")
    if refusal.reason is ClaimRefusal.BUSY:
        # A duplicate message (e.g. requeued after its pool process died): look again when the
        # current lease runs out. A live owner renews it; a dead one's child is taken over.
        log.info(
            "run %s child %s is leased elsewhere; checking again in %.1f s",
            run_id, index, refusal.lease_left,
        )  # fmt: skip
        raise task.retry(countdown=refusal.lease_left + 0.5, max_retries=None)
    log.info("run %s child %s: not started (%s)", run_id, index, refusal.reason.value)
    raise Ignore()


def _attempt_failed(
    task: Task, store: Store, claim: Claim, run_id: int, index: int, exc: Exception, delay: float
) -> None:
    error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DtaskError) else str(exc)
    try:
        state = store.fail_attempt(claim, error)
    except LeaseLost as lost:
        log.warning("run %s child %s: %s", run_id, index, lost)
        raise Ignore() from None
    if state is ChildState.FAILED:
        log.error("run %s child %s failed for good: %s", run_id, index, error)
        raise ChildFailed(store.child_error(run_id, index) or error) from exc
    log.warning(
        "run %s child %s attempt %s/%s failed, retrying from its checkpoint: %s",
        run_id, index, claim.attempt, claim.max_attempts, error,
    )  # fmt: skip
    raise task.retry(countdown=delay, max_retries=None, exc=exc)


@app.task(name=FINALIZE, acks_late=True, ignore_result=True)
def finalize(run_id: int) -> None:
    state = _store().finalize_run(run_id)
    log.info("run %s finalized: %s", run_id, state.value)
