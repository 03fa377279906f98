"""A message as this process received it, from receipt to acknowledgement: one object owns its
children's claims, their attempts and their writes (dramatiq's ``MessageProxy`` is the model).
A child's path, as docs/architecture.md draws it:

1. ``receive``: the message's children claimed ahead (a ``dtask.children`` message's in one
   statement; a one-child run's by its master's split) or not (a ``dtask.child``'s);
2. ``begin``: the next child started under its claim, claimed alone, or refused;
3. ``Attempt.run`` (dtask/worker/attempt.py): its function, with a heartbeat that renews
   through the message, checkpoints under its fence, a retry or failure through the message;
4. ``finish``: its success written, or held to be written with its siblings';
5. ``close``: what is held written, the claim let go, the run finalized if its last child
   ended here, the children's time noted;
6. Celery acknowledges the message.

Where the children came from is a subclass: their own ``dtask.child`` message (``OwnMessage``,
tasks.py), a ``dtask.children`` message (``Batch``, batch.py), their masters' task
(``InMaster``, inline_runs.py) or test mode's in-process call (eager.py). It says how they are
claimed ahead, tried again, handed back and ended, and where their writes go."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, NoReturn

from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Finished, Refusal, Store
from dtask.domain.runs import ClaimRefusal, RunState
from dtask.domain.templates import registry
from dtask.exceptions import ChildFailed, DatabaseUnavailable, DtaskError, LeaseLost
from dtask.settings import Settings
from dtask.worker import dispatcher, drain, links
from dtask.worker.attempt import Attempt
from dtask.worker.child_store import Child, hand_over, owner_name, patiently
from dtask.worker.finalize import finalize_if_last

log = logging.getLogger("dtask.worker")


class Received:
    """A message's children, each claimed, run and finished in turn: by default each write its
    own statement and a run finalized at once by its last child. ``skipped``: how a child may
    end for the message to go on with the next (else the message ends with it)."""

    retries = 0
    skipped: tuple[type[BaseException], ...] = ()

    def __init__(self, children: list[Child]) -> None:
        self.children = children
        self.took: list[float] = []  # the seconds each child's function took, of those that ran
        self._store: Store | None = None

    @property
    def store(self) -> Store:
        """This process's store, asked for once a message (where it is made, it may fail:
        asked where that is handled)."""
        store = self._store
        if store is None:
            store = self._store = services.store()
        return store

    def run(self) -> None:
        """The whole path, steps 1 to 5; step 6 is Celery's."""
        if not self.children:
            return
        self.receive()
        try:
            for position, child in enumerate(self.children):
                if drain.draining():  # stopping: let other processes take the rest
                    self.hand_back(self.children[position:])
                    break
                try:
                    seconds = self.one(child)
                except self.skipped:
                    continue
                if seconds is not None:
                    self.took.append(seconds)
        finally:
            self.close()
        self.ended_all()

    def receive(self) -> None:
        """Step 1. A template this worker does not know (a rolling deploy): the message waits
        for another worker, its children unclaimed."""
        template = self.children[0].template
        if template not in registry:
            if not self.retries:
                log.warning(
                    "%s: this worker does not know template %r; leaving it to another worker",
                    self.children[0], template,
                )  # fmt: skip
            self.elsewhere(template_backoff(self.retries))

    def one(self, child: Child) -> float | None:
        """Steps 2 to 4 for ``child``: the seconds its function took, or None where it did
        not run to its end."""
        config = services.current().settings
        try:
            if links.recently_cut_off(retry_after=config.network_timeout):
                log.info(
                    "%s: this worker cannot reach PostgreSQL; handing the child to another"
                    " worker", child,
                )  # fmt: skip
                self.retry(child, config.heartbeat_interval)
            claimed_at = time.monotonic()  # the lease runs from no earlier than this
            taken = self.begin(child, config)
            if isinstance(taken, Refusal):
                self._refused(child, taken)
                return None
            attempt = Attempt(self, child, taken, config, claimed_at)
            attempt.run()
            self.finalize(child)
            return attempt.worked
        except LeaseLost as exc:
            log.warning("%s: %s", child, exc)
            raise Ignore() from None
        except DatabaseUnavailable as exc:
            # Nothing can be recorded now. Try again later: the lease runs out and the next
            # claim resumes from the last committed checkpoint. Not counted by the chord.
            links.cut_off()
            log.warning("%s: %s; retrying in %g s", child, exc, config.lease_ttl)
            self.retry(child, config.lease_ttl)

    def begin(self, child: Child, config: Settings) -> Claim | Refusal:
        """Step 2: a child taken ahead starts under its claim; any other is claimed alone
        (which says why, where it cannot be)."""
        ttl = config.lease_ttl
        taken: Claim | Refusal | None = None
        if child.taken is not None:
            ahead = child.taken
            taken = patiently(lambda: self.start(child, ahead, ttl), ttl)
        if taken is None:
            store = self.store
            taken = patiently(
                lambda: store.children.claim(child.run_id, child.index, owner_name(), ttl), ttl
            )
        links.reached()
        return taken

    def start(self, child: Child, claim: Claim, lease_ttl: float) -> Claim | None:
        """A child taken ahead starts: its attempt counted, its lease from now."""
        return self.store.children.start(claim, lease_ttl)

    def renew(self, child: Child, claim: Claim, lease_ttl: float) -> RunState | None:
        """The running child's heartbeat."""
        return self.store.children.renew_lease(claim, lease_ttl)

    def finish(self, child: Child, done: Finished) -> None:
        """Step 4: its success."""
        self.store.children.finish(done.claim, done.checkpoint, done.result, done.output)

    def finalize(self, child: Child) -> None:
        """After a success: the run's last child finalizes it."""
        finalize_if_last(self.store, child.run_id)

    def retry(self, child: Child, countdown: float, exc: BaseException | None = None) -> NoReturn:
        """Try ``child`` again in ``countdown`` seconds, elsewhere or here; never returns."""
        raise NotImplementedError

    def elsewhere(self, countdown: float) -> NoReturn:
        """The whole message again in ``countdown`` seconds, for another worker."""
        self.hand_back(self.children, countdown)
        raise Ignore()

    def hand_back(self, rest: list[Child], countdown: float | None = None) -> None:
        """Children not started (a drain): their claims taken ahead handed back, and the
        children re-sent, ahead of first-time children."""
        for child in rest:
            if child.taken is not None:
                unclaim(self.store, child.taken)
        if hand_over(self.store, rest[0].run_id, rest[0].template, _items(rest), countdown):
            log.info("run %s: %s children handed over unstarted", rest[0].run_id, len(rest))

    def ended(self, child: Child) -> None:
        """``child`` ends without a result (its run cancelled or gone)."""

    def close(self) -> None:
        """Step 5, whatever happened: what is held written, the claim let go."""

    def ended_all(self) -> None:
        """Step 5, after the last child: its run finalized, the children's time noted."""

    def _refused(self, child: Child, refusal: Refusal) -> None:
        if refusal.reason is ClaimRefusal.DONE:
            return  # same id, state and result as the first report: the chord counts it once
        if refusal.reason is ClaimRefusal.FAILED:
            raise ChildFailed(refusal.error or "failed")
        # BUSY: a duplicate while another owner holds the lease (the reaper re-sends the child
        # if that owner dies); INACTIVE: the run was cancelled; GONE: the run was deleted.
        log.info("%s: not started (%s)", child, refusal.reason.value)
        if refusal.reason is not ClaimRefusal.BUSY:  # BUSY: the same task id runs elsewhere
            self.ended(child)
        raise Ignore()


def _items(children: list[Child]) -> list[tuple[int, dict[str, Any]]]:
    return [(c.index, c.spec) for c in children]


def unclaim(store: Store, claim: Claim) -> None:
    """Hand back a child taken ahead that never started; started, or not ours: as is."""
    with contextlib.suppress(LeaseLost, DatabaseUnavailable):
        store.children.unclaim(claim)


def template_backoff(retries: int) -> float:
    """Seconds before a message this worker could not run (no template) is offered again."""
    return float(min(2**retries, 2 * services.current().settings.stall_timeout))


# Children taken for the first time with others (a message's, or runs' taken together) run
# without a write of their own within this long of their claim (or the heartbeat interval's
# half, if shorter: their leases run from the claim): their successes are written together.
# It bounds what a killed worker runs again.
UNWRITTEN_FOR = 0.25


def unwritten_for() -> float:
    """How long after their claim children taken together start without a write."""
    return min(UNWRITTEN_FOR, services.current().settings.heartbeat_interval / 2)


def noted(index: int) -> bool:
    """Whether a child sent alone notes its time: the first few of a run (the dispatcher's
    first batch size comes from them), then one in ten (its moving average needs no more,
    and a write per child would cost what batches save)."""
    return index < 4 or index % 10 == 0


def note_time(run_id: int, seconds: float) -> None:
    """What the dispatcher sizes the run's messages by; a failure only leaves it older. The
    run's first time sends its waiting children at once: until then they went one to a
    message, a few per slot, and the dispatcher's loops may be at their idle pace (10,000
    no-op children: 150-250 ms of idle pool processes before the next pass)."""
    try:
        first = services.store().children.note_time(run_id, seconds)
    except DtaskError as exc:
        log.debug("run %s: child time not noted: %s", run_id, exc)
        return
    if first:
        dispatcher.nudge()
