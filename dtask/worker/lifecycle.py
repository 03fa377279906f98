"""A child's lifecycle, wherever it came from (a ``dtask.child`` message, one of a
``dtask.children`` message's, or a one-child run's master): claim under a lease with a fence,
heartbeat, run from the checkpoint, finish; a failed attempt, a refusal, a hand-over."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Redispatch, Refusal
from dtask.domain.context import ChildContext
from dtask.domain.results import encode_result
from dtask.domain.runs import ChildState, ClaimRefusal, RunState
from dtask.domain.templates import registry
from dtask.exceptions import (
    ChildFailed,
    ChildStopped,
    DatabaseUnavailable,
    DtaskError,
    ExecutionCapExceeded,
    LeaseLost,
)
from dtask.settings import Settings
from dtask.worker import drain, links, runaway
from dtask.worker.finalize import Finalizes, finalize_run
from dtask.worker.heartbeat import Heartbeat
from dtask.worker.messages import publish
from dtask.worker.output import Tail

log = logging.getLogger("dtask.worker")


def template_backoff(retries: int) -> float:
    """Seconds before a message this worker could not run (no template) is offered again."""
    return float(min(2**retries, 2 * services.current().settings.stall_timeout))


T = TypeVar("T")


# a claimed child's success written: (its claim, its last checkpoint, its result as JSON text)
Finish = Callable[[Claim, Any | None, str | None], None]
# a child taken ahead starts, or a running child's lease is renewed: (its claim, the lease)
Start = Callable[[Claim, float], Claim | None]
Renew = Callable[[Claim, float], RunState | None]


@dataclass(frozen=True)
class Writes:
    """Where a child's message writes its start, success or heartbeat its own way (a batch
    holds successes, a one-child run finishes with its run); None: ``children``'s own."""

    start: Start | None = None
    finish: Finish | None = None
    renew: Renew | None = None


class ChildWrites(Protocol):
    """What a claimed child's lifecycle writes: ``dtask.db.children.ChildStore`` (each write
    fenced), or a fake of it in unit tests."""

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None: ...
    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float) -> None: ...
    def finish(
        self, claim: Claim, final_checkpoint: Any | None, result: str | None = None
    ) -> None: ...
    def release(self, claim: Claim, checkpoint: Any | None) -> None: ...
    def fail_attempt(
        self, claim: Claim, error: str, traceback: str | None = None, output: str | None = None
    ) -> ChildState: ...
    def error(self, run_id: int, index: int) -> str | None: ...
    def any_unfinished(self, run_id: int) -> bool: ...


class LifecycleStore(Protocol):
    """The part of ``Store`` the child lifecycle uses."""

    @property
    def children(self) -> ChildWrites: ...
    @property
    def runs(self) -> Finalizes: ...


def owner_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def patiently(
    call: Callable[[], T], patience: float, give_up: Callable[[], bool] = lambda: False
) -> T:
    """Retry a write while PostgreSQL is unreachable (a restart), for up to ``patience`` s,
    or until ``give_up()``."""
    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return call()
        except DatabaseUnavailable:
            if time.monotonic() + delay > deadline or give_up():
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class Delivery(Protocol):
    """The message a child came in: how it is tried again later (Celery's retry of a message
    of its own; a message of its own, in a batch) and ended without a result."""

    @property
    def retries(self) -> int: ...
    def retry(self, countdown: float, exc: BaseException | None = None) -> NoReturn: ...
    def ended(self) -> None: ...


def run_child(
    delivery: Delivery,
    run_id: int,
    index: int,
    template: str,
    spec: dict[str, Any],
    finalize: bool = True,
    taken_ahead: Claim | None = None,
    writes: Writes = Writes(),
) -> float | None:
    """Claim, run and finish one child, wherever its message came from; with ``finalize``,
    then finalize its run if it was the last (a batch asks once, after its last child).
    ``taken_ahead``: the child was claimed with its message's others, or by its master's
    split (it only starts here). The seconds it took from claim to finish, or None where it
    did not run to its end."""
    config = services.current().settings
    began = time.monotonic()
    try:
        store = services.store()
        if drain.draining():  # stopping: let another process take it
            hand_over(store, run_id, template, [(index, spec)])
            raise Ignore()
        if template not in registry:  # a rolling deploy: leave it, unclaimed, to other workers
            if not delivery.retries:
                log.warning(
                    "run %s child %s: this worker does not know template %r; leaving it to"
                    " another worker", run_id, index, template,
                )  # fmt: skip
            delivery.retry(template_backoff(delivery.retries))
        if links.recently_cut_off(retry_after=config.network_timeout):
            log.info(
                "run %s child %s: this worker cannot reach PostgreSQL; handing the child to"
                " another worker", run_id, index,
            )  # fmt: skip
            delivery.retry(config.heartbeat_interval)
        claimed_at = time.monotonic()  # the lease runs from no earlier than this
        taken: Claim | Refusal | None = None
        if taken_ahead is not None:
            ahead, starts = taken_ahead, writes.start or store.children.start
            taken = patiently(lambda: starts(ahead, config.lease_ttl), config.lease_ttl)
        if taken is None:
            taken = patiently(
                lambda: store.children.claim(run_id, index, owner_name(), config.lease_ttl),
                config.lease_ttl,
            )
        links.reached()
        if isinstance(taken, Refusal):
            _refused(delivery, run_id, index, taken)
            return None
        _run_claimed(
            delivery, store, taken, run_id, index, template, spec, config, claimed_at, writes
        )
        took = time.monotonic() - began
        if finalize:
            finalize_if_last(store, run_id)
        return took
    except LeaseLost as exc:
        log.warning("run %s child %s: %s", run_id, index, exc)
        raise Ignore() from None
    except DatabaseUnavailable as exc:
        # Nothing can be recorded now. Try again later: the lease runs out and the next
        # claim resumes from the last committed checkpoint. Not counted by the chord.
        links.cut_off()
        log.warning("run %s child %s: %s; retrying in %g s", run_id, index, exc, config.lease_ttl)
        delivery.retry(config.lease_ttl)


def noted(index: int) -> bool:
    """Whether a child sent alone notes its time: the first few of a run (the dispatcher's
    first batch size comes from them), then one in ten (its moving average needs no more,
    and a write per child would cost what batches save)."""
    return index < 4 or index % 10 == 0


def note_time(run_id: int, seconds: float) -> None:
    """What the dispatcher sizes the run's messages by; a failure only leaves it older."""
    try:
        services.store().children.note_time(run_id, seconds)
    except DtaskError as exc:
        log.debug("run %s: child time not noted: %s", run_id, exc)


def hand_over(
    store: LifecycleStore,
    run_id: int,
    template: str,
    items: list[tuple[int, dict[str, Any]]],
    countdown: float | None = None,
) -> bool:
    """Re-send children of one run this worker let go of, ahead of first-time children, in one
    publish (after ``countdown`` seconds); False when the run is no longer active (cancelled):
    nothing goes on with them."""
    run = store.runs.get(run_id)
    if run.state in (RunState.SPLITTING, RunState.RUNNING) and run.group_id is not None:
        resent = [Redispatch(run_id, i, s, template, run.group_id, run.queue) for i, s in items]
        publish(resent, countdown=countdown)
        return True
    return False


def _run_claimed(
    delivery: Delivery,
    store: LifecycleStore,
    claim: Claim,
    run_id: int,
    index: int,
    template: str,
    spec: dict[str, Any],
    config: Settings,
    claimed_at: float,
    writes: Writes = Writes(),
) -> None:
    tpl = registry.get(template)
    finished = writes.finish or store.children.finish
    renew = writes.renew or store.children.renew_lease
    cap = _Cap(claim.execution_cap or tpl.options.execution_cap, run_id, index, claim.attempt)
    beat = Heartbeat(
        lambda: renew(claim, config.lease_ttl),
        config.heartbeat_interval,
        name=f"{run_id}.{index}",
        give_up_at=cap.deadline + config.execution_cap_grace,
        give_up=lambda: runaway.kill_this_pool_process(
            cap.killed(config.execution_cap_grace),
            lambda: store.children.fail_attempt(claim, cap.killed(config.execution_cap_grace)),
        ),
        lease=config.lease_ttl,
        since=claimed_at,
    )

    def fenced_write(write: Callable[[], None]) -> None:
        """A write under our fence; it renews the lease when it succeeds. Given up on once
        the lease has run out: another worker may be running the child by then."""
        sent_at = time.monotonic()
        try:
            patiently(write, config.lease_ttl, give_up=beat.expired)
        except LeaseLost:
            beat.lost.set()
            raise
        beat.renewed(sent_at)

    def release_and_hand_over() -> None:
        with contextlib.suppress(LeaseLost):
            store.children.release(claim, None)  # keeps the last committed checkpoint
        hand_over(store, run_id, template, [(index, spec)])

    drain.running(release_and_hand_over)
    # sys.stdout is the process's: only a prefork pool process runs one child at a time
    printed = Tail(sys.stdout) if runaway.in_pool_process() else None
    try:
        with beat:
            ctx = ChildContext(
                run_id=run_id,
                index=index,
                template=template,
                attempt=claim.attempt,
                checkpoint_state=claim.checkpoint,
                writer=lambda state: fenced_write(
                    lambda: store.children.checkpoint(claim, state, config.lease_ttl)
                ),
                checkpoint_interval=tpl.options.checkpoint_interval or config.checkpoint_interval,
                checkpoint_every=tpl.options.checkpoint_every or config.checkpoint_every,
                max_checkpoint=config.max_checkpoint,
                lease_lost=beat.lease_lost,
                stop_requested=lambda: (
                    beat.stop_requested.is_set() or drain.draining() or cap.exceeded()
                ),
            )
            with contextlib.redirect_stdout(printed) if printed else contextlib.nullcontext():
                value = tpl.function(ctx, **claim.spec)
            if beat.lost.is_set():
                raise LeaseLost(f"run {run_id} child {index} was taken over elsewhere")
            what = f"run {run_id} child {index}"
            result = encode_result(value, config.max_child_result, what, "DTASK_MAX_CHILD_RESULT")
            final = ctx.unsaved_checkpoint  # with ctx.state: checked as any checkpoint
            fenced_write(lambda: finished(claim, final, result))
    except (LeaseLost, DatabaseUnavailable) as exc:
        if beat.expired() and not beat.lost.is_set():
            moved = _fence_moved(store, claim)
            if moved is None:
                links.cut_off()
            if not moved:
                raise LeaseLost(_expired(beat, index, exc, cut_off=moved is None)) from None
        raise
    except ChildStopped:
        if cap.exceeded():  # a failed attempt, retried from the checkpoint it just committed
            failure = ExecutionCapExceeded(cap.message())
            _attempt_failed(
                delivery, store, claim, run_id, index, failure, config.retry_delay,
                printed.text() if printed else None,
            )  # fmt: skip
        patiently(lambda: store.children.release(claim, None), config.lease_ttl)
        # Always, also after a cancel: a rerun may have made the run active again meanwhile,
        # and its message for this child was dropped as a duplicate while we held the lease.
        # hand_over re-sends only while the run is active.
        if not hand_over(store, run_id, template, [(index, spec)]):
            delivery.ended()
        log.info("run %s child %s stopped at its checkpoint and was released", run_id, index)
        raise Ignore() from None
    except Exception as exc:
        _attempt_failed(
            delivery, store, claim, run_id, index, exc, config.retry_delay,
            printed.text() if printed else None,
        )  # fmt: skip
    finally:
        drain.running(None)


class _Cap:
    """An attempt's execution cap, counted from when this worker started the attempt."""

    def __init__(self, seconds: float | None, run_id: int, index: int, attempt: int) -> None:
        self.seconds = seconds
        self.deadline = math.inf if seconds is None else time.monotonic() + seconds
        self._what = f"run {run_id} child {index} attempt {attempt}"

    def exceeded(self) -> bool:
        return time.monotonic() >= self.deadline

    def message(self) -> str:
        return f"{self._what} exceeded its execution cap of {self.seconds:g} s"

    def killed(self, grace: float) -> str:
        return f"{self.message()}; it did not stop within {grace:g} s and its process was killed"


def _fence_moved(store: LifecycleStore, claim: Claim) -> bool | None:
    """For a lease that expired unrenewed: True if another worker took the child, False if it
    is still ours (this process was paused; the lease is now set to end at once, so the reaper
    re-sends the child without waiting), None if PostgreSQL does not answer (cut off)."""
    try:
        return store.children.renew_lease(claim, 0) is None
    except DtaskError:
        return None


def _expired(beat: Heartbeat, index: int, exc: Exception, cut_off: bool) -> str:
    unrenewed = f"no renewal for {beat.unrenewed_for():.1f} s (lease {beat.lease:g} s)"
    if cut_off:
        cause = beat.last_error or (str(exc) if isinstance(exc, DatabaseUnavailable) else None)
        why = f"cut off from PostgreSQL ({cause or 'no answer'}): lease expired, {unrenewed}"
    else:
        why = f"lease expired while this process could not renew it (paused?), {unrenewed}"
    return f"{why}, stopping child {index}; another worker resumes it from its last checkpoint"


TRACEBACK_KEPT = 16_000  # characters of a failed attempt's traceback kept (its end)


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= TRACEBACK_KEPT else "...\n" + text[-TRACEBACK_KEPT:]


def finalize_if_last(store: LifecycleStore, run_id: int) -> None:
    """The run's last child to finish finalizes it from PostgreSQL's counts, whatever the
    result backend (a chord callback, where there is one, then finds it done). A failure is
    left to the chord callback or the reaper."""
    try:
        if not store.children.any_unfinished(run_id):
            state = finalize_run(store, run_id)
            log.info("run %s finalized by its last child: %s", run_id, state.value)
    except Exception as exc:  # the child itself succeeded: never fail it for this
        log.warning("run %s: not finalized by its last child (the reaper will): %s", run_id, exc)


def _refused(delivery: Delivery, run_id: int, index: int, refusal: Refusal) -> None:
    if refusal.reason is ClaimRefusal.DONE:
        return  # same id, state and result as the first report: the chord counts it once
    if refusal.reason is ClaimRefusal.FAILED:
        raise ChildFailed(refusal.error or "failed")
    # BUSY: a duplicate while another owner holds the lease (the reaper re-sends the child
    # if that owner dies); INACTIVE: the run was cancelled; GONE: the run was deleted.
    log.info("run %s child %s: not started (%s)", run_id, index, refusal.reason.value)
    if refusal.reason is not ClaimRefusal.BUSY:  # BUSY: the same task id runs elsewhere
        delivery.ended()
    raise Ignore()


def _attempt_failed(
    delivery: Delivery,
    store: LifecycleStore,
    claim: Claim,
    run_id: int,
    index: int,
    exc: Exception,
    delay: float,
    output: str | None = None,
) -> None:
    error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DtaskError) else str(exc)
    state = store.children.fail_attempt(claim, error, _traceback(exc), output)
    if state is ChildState.FAILED:
        log.error("run %s child %s failed for good: %s", run_id, index, error)
        finalize_if_last(store, run_id)
        raise ChildFailed(store.children.error(run_id, index) or error) from exc
    log.warning(
        "run %s child %s attempt %s/%s failed, retrying from its checkpoint: %s",
        run_id, index, claim.attempt, claim.max_attempts, error,
    )  # fmt: skip
    delivery.retry(delay, exc)
