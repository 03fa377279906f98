"""A child's lifecycle, wherever it came from (its ``Delivery``: a ``dtask.child`` message,
one of a ``dtask.children`` message's, or a one-child run's master): refused or claimed under
a lease with a fence, then run as an ``Attempt`` (dtask/worker/attempt.py), finalizing its
run if it was the last; a hand-over."""

from __future__ import annotations

import logging
import time

from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Refusal
from dtask.domain.runs import ClaimRefusal
from dtask.domain.templates import registry
from dtask.exceptions import (
    ChildFailed,
    DatabaseUnavailable,
    DtaskError,
    LeaseLost,
)
from dtask.worker import dispatcher, drain, links
from dtask.worker.attempt import Attempt
from dtask.worker.child_store import hand_over, owner_name, patiently
from dtask.worker.delivery import Delivery

log = logging.getLogger("dtask.worker")


def template_backoff(retries: int) -> float:
    """Seconds before a message this worker could not run (no template) is offered again."""
    return float(min(2**retries, 2 * services.current().settings.stall_timeout))


def run_child(delivery: Delivery) -> float | None:
    """Claim, run and finish one child, wherever it came from (``delivery`` says), then let the
    delivery finalize its run if it was the last. The seconds its function took, or None
    where it did not run to its end: what a message of such children costs per child, since
    a message claims its children in one commit, whereas a child's own claim and finish
    cost most on a busy database, where several to a message saves most."""
    config = services.current().settings
    run_id, index, template = delivery.run_id, delivery.index, delivery.template
    try:
        store = services.store()
        if drain.draining():  # stopping: let another process take it
            hand_over(store, run_id, template, [(index, delivery.spec)])
            raise Ignore()
        if template not in registry:  # a rolling deploy: leave it, unclaimed, to other workers
            if not delivery.retries:
                log.warning(
                    "%s: this worker does not know template %r; leaving it to another worker",
                    delivery, template,
                )  # fmt: skip
            delivery.retry(template_backoff(delivery.retries))
        if links.recently_cut_off(retry_after=config.network_timeout):
            log.info(
                "%s: this worker cannot reach PostgreSQL; handing the child to another worker",
                delivery,
            )  # fmt: skip
            delivery.retry(config.heartbeat_interval)
        claimed_at = time.monotonic()  # the lease runs from no earlier than this
        taken: Claim | Refusal | None = None
        if delivery.taken is not None:
            ahead = delivery.taken
            taken = patiently(
                lambda: delivery.start(store, ahead, config.lease_ttl), config.lease_ttl
            )
        if taken is None:
            taken = patiently(
                lambda: store.children.claim(run_id, index, owner_name(), config.lease_ttl),
                config.lease_ttl,
            )
        links.reached()
        if isinstance(taken, Refusal):
            _refused(delivery, taken)
            return None
        attempt = Attempt(delivery, store, taken, config, claimed_at)
        attempt.run()
        delivery.finalize(store)
        return attempt.worked
    except LeaseLost as exc:
        log.warning("%s: %s", delivery, exc)
        raise Ignore() from None
    except DatabaseUnavailable as exc:
        # Nothing can be recorded now. Try again later: the lease runs out and the next
        # claim resumes from the last committed checkpoint. Not counted by the chord.
        links.cut_off()
        log.warning("%s: %s; retrying in %g s", delivery, exc, config.lease_ttl)
        delivery.retry(config.lease_ttl)


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


def _refused(delivery: Delivery, refusal: Refusal) -> None:
    if refusal.reason is ClaimRefusal.DONE:
        return  # same id, state and result as the first report: the chord counts it once
    if refusal.reason is ClaimRefusal.FAILED:
        raise ChildFailed(refusal.error or "failed")
    # BUSY: a duplicate while another owner holds the lease (the reaper re-sends the child
    # if that owner dies); INACTIVE: the run was cancelled; GONE: the run was deleted.
    log.info("%s: not started (%s)", delivery, refusal.reason.value)
    if refusal.reason is not ClaimRefusal.BUSY:  # BUSY: the same task id runs elsewhere
        delivery.ended()
    raise Ignore()
