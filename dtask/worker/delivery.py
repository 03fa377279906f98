"""Where a child reached this process from, one object per child: its own ``dtask.child``
message (``OwnMessage``, dtask/worker/tasks.py), a ``dtask.children`` message with others
(``InBatch``, dtask/worker/batch.py), its master's task (``InMaster``, a one-child run), or
test mode's in-process call (dtask/worker/eager.py). It knows the child (run, index, template,
spec, a claim taken ahead), how the child is tried again or ends without a result, and where
its start, heartbeat renewals and success are written; the lifecycle
(dtask/worker/lifecycle.py) asks it and never where the child came from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from dtask.worker.finalize import finalize_if_last

if TYPE_CHECKING:
    from dtask.db import Claim, Finished
    from dtask.domain.runs import RunState
    from dtask.worker.child_store import LifecycleStore


class Delivery:
    """A child of its own message: each write its own statement, its run finalized at once by
    the last child to finish. Subclasses say how a retry goes."""

    retries = 0

    def __init__(
        self,
        run_id: int,
        index: int,
        template: str,
        spec: dict[str, Any],
        taken: Claim | None = None,
    ) -> None:
        self.run_id, self.index, self.template, self.spec = run_id, index, template, spec
        self.taken = taken  # claimed with its message's others, or by its master's split

    def __str__(self) -> str:
        return f"run {self.run_id} child {self.index}"

    def start(self, store: LifecycleStore, claim: Claim, lease_ttl: float) -> Claim | None:
        """A child taken ahead starts: its attempt counted, its lease from now."""
        return store.children.start(claim, lease_ttl)

    def renew(self, store: LifecycleStore, claim: Claim, lease_ttl: float) -> RunState | None:
        return store.children.renew_lease(claim, lease_ttl)

    def finish(self, store: LifecycleStore, done: Finished) -> None:
        store.children.finish(done.claim, done.checkpoint, done.result, done.output)

    def finalize(self, store: LifecycleStore) -> None:
        """After a success: the run's last child finalizes it."""
        finalize_if_last(store, self.run_id)

    def retry(self, countdown: float, exc: BaseException | None = None) -> NoReturn:
        """Try the child again in ``countdown`` seconds, elsewhere or here; never returns."""
        raise NotImplementedError

    def ended(self) -> None:
        """The child ends without a result (its run cancelled or gone)."""
