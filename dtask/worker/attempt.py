"""A claimed child's attempt in this process: its lease kept by a heartbeat, its execution
cap, its fenced writes (checkpoints, its success), and how it ends: finished, stopped at its
checkpoint and handed back, failed (tried again from its checkpoint, or for good), or lost to
another worker."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar

from celery.exceptions import Ignore

from dtask import tracing
from dtask.db import Claim, Finished
from dtask.domain.async_context import AsyncChildContext
from dtask.domain.context import ChildContext, Stealable
from dtask.domain.results import encode_result
from dtask.domain.runs import ChildState, RunState
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
from dtask.worker import coroutines, drain, links, runaway, steals
from dtask.worker.child_store import Child, LifecycleStore, hand_over, owner_name, patiently
from dtask.worker.finalize import finalize_if_last
from dtask.worker.heartbeat import Heartbeat
from dtask.worker.output import Tail

log = logging.getLogger("dtask.worker")
T = TypeVar("T")
TRACEBACK_KEPT = 16_000  # characters of a failed attempt's traceback kept (its end)


class Message(Protocol):
    """What an attempt asks of the message its child came in (``Received``,
    dtask/worker/received.py)."""

    @property
    def store(self) -> LifecycleStore: ...
    def renew(self, child: Child, claim: Claim, lease_ttl: float) -> RunState | None: ...
    def finish(self, child: Child, done: Finished) -> None: ...
    def retry(
        self, child: Child, countdown: float, exc: BaseException | None = None
    ) -> NoReturn: ...
    def ended(self, child: Child) -> None: ...


class Attempt:
    """Step 3 of a child's path (dtask/worker/received.py): ``child`` of the message
    ``received``, under ``claim``; it asks ``received`` where its lease is renewed, its success
    written, and how it is tried again or ends."""

    def __init__(
        self, received: Message, child: Child, claim: Claim, config: Settings, claimed_at: float
    ) -> None:
        self.received, self.child, self.claim, self.config = received, child, claim, config
        self.claimed_at = claimed_at
        store: LifecycleStore = received.store
        self.store = store
        self.template = registry.get(child.template)
        options = self.template.options
        cap = claim.execution_cap or options.execution_cap or config.default_execution_cap
        self.cap = Cap(cap, child, claim.attempt)
        grace = config.execution_cap_grace
        self.beat = Heartbeat(
            self._renew,
            config.heartbeat_interval,
            name=f"{child.run_id}.{child.index}",
            give_up_at=self.cap.deadline + grace,
            give_up=lambda: runaway.kill_this_pool_process(
                self.cap.killed(grace),
                lambda: store.children.fail_attempt(
                    claim, self.cap.killed(grace), None, self.printed.text()
                ),
            ),
            lease=config.lease_ttl,
            since=claimed_at,
            on_stop=self._cancelled,
        )
        # what it prints (sys.stdout is the process's: only a prefork pool process runs one
        # child at a time, so only there is it redirected) and logs through ctx.log
        self.printed = Tail(config.max_child_log)
        self.logged = 0  # what the heartbeat last wrote of it (Tail.written)
        self.worked: float | None = None  # seconds in the child's function, once it returned

    def _renew(self) -> RunState | None:
        """The heartbeat: renew the lease; and where the child printed since the last one,
        write what it printed so far (`dtask logs --follow`), a lost write only a late one."""
        state = self.received.renew(self.child, self.claim, self.config.lease_ttl)
        written = self.printed.written
        if state is not None and written != self.logged:
            d = self.child
            try:
                self.store.children.write_log(
                    d.run_id, d.index, self.claim.attempt, owner_name(), self.printed.kept()
                )
                self.logged = written
            except DtaskError as exc:
                log.debug("%s: its output is written at the next heartbeat: %s", d, exc)
        return state

    def run(self) -> None:
        """Run the child to its end here; raises what its message's retry raises, Ignore
        where it stopped or was lost, ChildFailed where it failed for good."""
        claim, config, child = self.claim, self.config, self.child
        drain.running(self._hand_back)
        try:
            with self.beat:
                called_at = time.monotonic()
                value = self._call()
                self.worked = time.monotonic() - called_at
                if self.beat.lost.is_set():
                    raise LeaseLost(f"{child} was taken over elsewhere")
                what = str(child)
                limit = config.max_child_result
                result = encode_result(value, limit, what, "DTASK_MAX_CHILD_RESULT")
                final = self.context.unsaved_checkpoint  # with ctx.state: checked as any
                done = Finished(claim, final, result, self.printed.text())
                self._write(lambda: self.received.finish(child, done))
        except (LeaseLost, DatabaseUnavailable) as exc:
            self._lost(exc)
            raise
        except ChildStopped:
            self._stopped()
        except Exception as exc:
            self._failed(exc)
        finally:
            drain.running(None)
            # its context holds closures over this attempt: without it the attempt is freed
            # as it ends, not by the collector's next pass over every attempt since
            self.__dict__.pop("context", None)
            unlogged = self.printed.unlogged()
            if unlogged:
                log.warning(
                    "%s attempt %s printed %s characters more than this log takes"
                    " (DTASK_MAX_CHILD_LOG); its last ones: dtask logs %s --child %s",
                    child, claim.attempt, f"{unlogged:,}", child.run_id, child.index,
                )  # fmt: skip

    def _call(self) -> Any:
        claim, config, options = self.claim, self.config, self.template.options
        stdout = self.printed.stream(sys.stdout)
        self.context = ChildContext(
            run_id=self.child.run_id,
            index=self.child.index,
            template=self.child.template,
            attempt=claim.attempt,
            checkpoint_state=claim.checkpoint,
            writer=tracing.checkpoints(
                self.child.index,
                lambda state: self._write(
                    lambda: self.store.children.checkpoint(
                        claim, state, config.lease_ttl, time.monotonic() - self.claimed_at
                    )
                ),
            ),
            stealable=self._stealable(),
            checkpoint_interval=options.checkpoint_interval or config.checkpoint_interval,
            checkpoint_every=options.checkpoint_every or config.checkpoint_every,
            max_checkpoint=config.max_checkpoint,
            lease_lost=self.beat.lease_lost,
            stop_requested=lambda: (
                self.beat.stop_requested.is_set() or drain.draining() or self.cap.exceeded()
            ),
            echo=self.printed.add,
            output=stdout.write,
            max_output_line=config.max_output_line,
            max_result=config.max_child_result,
        )
        if not runaway.in_pool_process():
            return self._function()
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(self.printed.stream(sys.stderr)),
        ):
            return self._function()

    def _function(self) -> Any:
        function, spec = self.template.function, self.claim.spec
        if not self.template.is_async:
            return function(self.context, **spec)
        return coroutines.run(function(AsyncChildContext(self.context), **spec), self._let_go)

    def _let_go(self) -> BaseException | None:
        """Why an async child's task is cancelled now, if it is: what its sync twin's next
        step would raise."""
        what = str(self.child)
        if self.beat.lease_lost():
            return LeaseLost(f"{what} was taken over elsewhere")
        if self.context.should_stop():
            return ChildStopped(f"{what} was stopped while it awaited")
        return None

    def _write(self, write: Callable[[], T]) -> T:
        """A write under our fence; it renews the lease when it succeeds. Given up on once
        the lease has run out: another worker may be running the child by then."""
        sent_at = time.monotonic()
        try:
            done = patiently(write, self.config.lease_ttl, give_up=self.beat.expired)
        except LeaseLost:
            self.beat.lost.set()
            raise
        self.beat.renewed(sent_at)
        return done

    def _stealable(self) -> Stealable | None:
        """The child's range and how it gives the rest's second half away (elastic.md)."""
        keys = self.template.range_keys()
        if keys is None:
            return None
        a, b = (self.claim.spec.get(k) for k in keys)
        if not (isinstance(a, int) and isinstance(b, int)):
            return None
        stealable = Stealable(a, b, lambda at: self._give_away(stealable, keys, at))
        return stealable

    def _cancelled(self) -> None:
        """The heartbeat saw the run stop running. Cancelled with ``terminate``: a child that
        has not stopped at its next step within the grace has its pool process killed, released
        first (a rerun resumes it from its checkpoint)."""
        d, store, claim = self.child, self.store, self.claim
        try:
            if not store.runs.terminating(d.run_id):
                return
        except DtaskError as exc:
            log.warning("%s: could not tell whether its cancel terminates: %s", d, exc)
            return
        why = f"{d} attempt {claim.attempt}: its run was cancelled with --terminate"
        self.beat.end_by(
            time.monotonic() + self.config.execution_cap_grace,
            lambda: runaway.kill_this_pool_process(
                why, lambda: store.children.release(claim, None)
            ),
        )

    def _give_away(self, stealable: Stealable, keys: tuple[str, str], at: int) -> bool:
        d, claim = self.child, self.claim
        deferred = self.config.dispatch == "window"
        gift = self._write(
            lambda: self.store.children.give_away(claim, d.run_id, keys, stealable.b, at, deferred)
        )
        if gift is None:
            return False
        steals.after_gift(self.store, d.run_id, gift, deferred)
        return True

    def _hand_back(self) -> None:
        """A drain's hand-over of the running child (from the signal handler)."""
        with contextlib.suppress(LeaseLost):
            self.store.children.release(self.claim, None)  # keeps the last checkpoint
        self._resend()

    def _resend(self) -> bool:
        d = self.child
        return hand_over(self.store, d.run_id, d.template, [(d.index, d.spec)])

    def _lost(self, exc: Exception) -> None:
        """Lease lost or PostgreSQL gone: a lease that expired unrenewed says which."""
        beat = self.beat
        if beat.expired() and not beat.lost.is_set():
            moved = fence_moved(self.store, self.claim)
            if moved is None:
                links.cut_off()
            if not moved:
                why = expired(beat, self.child.index, exc, cut_off=moved is None)
                raise LeaseLost(why) from None

    def _stopped(self) -> None:
        if self.cap.exceeded():  # a failed attempt, retried from the checkpoint it committed
            self._failed(ExecutionCapExceeded(self.cap.message()))
        patiently(lambda: self.store.children.release(self.claim, None), self.config.lease_ttl)
        # Always, also after a cancel: a rerun may have made the run active again meanwhile,
        # and its message for this child was dropped as a duplicate while we held the lease.
        # hand_over re-sends only while the run is active.
        if not self._resend():
            self.received.ended(self.child)
        log.info("%s stopped at its checkpoint and was released", self.child)
        raise Ignore() from None

    def _failed(self, exc: Exception) -> None:
        d, claim = self.child, self.claim
        error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DtaskError) else str(exc)
        output, skipped = self.printed.kept()
        final = not self.template.options.retries(exc)
        state = self.store.children.fail_attempt(
            claim, error, _traceback(exc), output, final, skipped
        )
        if state is ChildState.FAILED:
            log.error("%s failed for good: %s", d, error)
            finalize_if_last(self.store, d.run_id)
            raise ChildFailed(self.store.children.error(d.run_id, d.index) or error) from exc
        log.warning(
            "%s attempt %s/%s failed, retrying from its checkpoint: %s",
            d, claim.attempt, claim.max_attempts, error,
        )  # fmt: skip
        self.received.retry(d, self.config.retry_delay, exc)


class Cap:
    """An attempt's execution cap, counted from when this worker started the attempt."""

    def __init__(self, seconds: float | None, child: Child, attempt: int) -> None:
        self.seconds = seconds
        self.deadline = math.inf if seconds is None else time.monotonic() + seconds
        self._child, self._attempt = child, attempt

    def exceeded(self) -> bool:
        return time.monotonic() >= self.deadline

    def message(self) -> str:
        what = f"{self._child} attempt {self._attempt}"
        return f"{what} exceeded its execution cap of {self.seconds:g} s"

    def killed(self, grace: float) -> str:
        return f"{self.message()}; it did not stop within {grace:g} s and its process was killed"


def fence_moved(store: LifecycleStore, claim: Claim) -> bool | None:
    """For a lease that expired unrenewed: True if another worker took the child, False if it
    is still ours (this process was paused; the lease is now set to end at once, so the reaper
    re-sends the child without waiting), None if PostgreSQL does not answer (cut off)."""
    try:
        return store.children.renew_lease(claim, 0) is None
    except DtaskError:
        return None


def expired(beat: Heartbeat, index: int, exc: Exception, cut_off: bool) -> str:
    unrenewed = f"no renewal for {beat.unrenewed_for():.1f} s (lease {beat.lease:g} s)"
    if cut_off:
        cause = beat.last_error or (str(exc) if isinstance(exc, DatabaseUnavailable) else None)
        why = f"cut off from PostgreSQL ({cause or 'no answer'}): lease expired, {unrenewed}"
    else:
        why = f"lease expired while this process could not renew it (paused?), {unrenewed}"
    return f"{why}, stopping child {index}; another worker resumes it from its last checkpoint"


def _traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= TRACEBACK_KEPT else "...\n" + text[-TRACEBACK_KEPT:]
