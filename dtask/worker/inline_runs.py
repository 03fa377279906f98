"""One-child runs whose child runs in their master's task (``InMaster``): a ``dtask.master``
message's run, or several runs of a ``dtask.masters`` message taken together (``run_many``):
split in one transaction, their children run one after the other, their successes and the
runs' with them written in one (``InMasters``). What that saves over a child message is
docs/benchmarks.md's "many small runs"."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from functools import partial
from typing import Any, NoReturn

from celery.exceptions import Ignore

from dtask import services
from dtask.db import Claim, Finished, Store
from dtask.db.children import lease_lost
from dtask.db.workers import LiveSlots
from dtask.domain.runs import RunState
from dtask.domain.templates import registry
from dtask.exceptions import ChildFailed, DatabaseUnavailable
from dtask.worker import chains, links
from dtask.worker.child_store import Child, hand_over, owner_name, patiently
from dtask.worker.finalize import finalize_run, start_released
from dtask.worker.received import Received, unclaim, unwritten_for
from dtask.worker.time_limit import time_limit

log = logging.getLogger("dtask.worker")

SEEN = 8  # children of a template whose time is kept
# template -> its last children's times in this process
_child_seconds: dict[str, deque[float]] = {}


def child_seconds(template: str) -> float | None:
    """How long ``template``'s children take in this process, if it ran any: the shortest of
    the last SEEN. A busy machine only adds to a child's time, and a process's first child
    of a template pays its imports: an average of those could make children of a
    millisecond look past BATCH_SECONDS, and a message then runs one run and sends the rest
    back. A template whose children are long has no short one to show."""
    times = _child_seconds.get(template)
    return min(times) if times else None


def note_child_seconds(template: str, took: float) -> None:
    _child_seconds.setdefault(template, deque(maxlen=SEEN)).append(took)


def run_inline(children: list[Child]) -> None:
    """Run children taken by their masters' splits, noting their time."""
    InMaster(children).run()


class InMaster(Received):
    """One-child runs' children, taken for their masters' task by the split (``run_master``'s
    ``inline``) and run there: no message, no dispatcher pass, no chord count of their own;
    each finishes its run with it (in one transaction where the template has no reduce).
    Tried again later, or handed over, as a ``dtask.child`` message of its own. Flower shows
    the master's task for them."""

    skipped = (Ignore, ChildFailed)

    def __init__(self, children: list[Child]) -> None:
        super().__init__(children)
        self.finished_runs: set[int] = set()

    def finish(self, child: Child, done: Finished) -> None:
        if registry.get(child.template).reduce is not None:
            super().finish(child, done)
            return
        chained: list[int] = []
        whole = services.store()  # its runs finish alone; a LifecycleStore's only finalize
        released = whole.runs.finish_alone(child.run_id, done, chained)
        if released is not None:
            self.finished_runs.add(child.run_id)
        if chained:
            chains.after_finish(whole, child.run_id)
        if released:
            start_released(child.run_id, released)

    def finalize(self, child: Child) -> None:
        if child.run_id in self.finished_runs:
            return
        try:
            state = finalize_run(self.store, child.run_id, chord=False)
            log.info("run %s finalized by its child: %s", child.run_id, state.value)
        except Exception as exc:  # the child itself succeeded: never fail it for this
            log.warning(
                "run %s: not finalized by its child (the reaper will): %s", child.run_id, exc
            )

    def retry(self, child: Child, countdown: float, exc: BaseException | None = None) -> NoReturn:
        claim = child.taken
        assert claim is not None  # a master's split takes its child
        unclaim(self.store, claim)
        hand_over(self.store, child.run_id, child.template, [(child.index, child.spec)], countdown)
        raise Ignore()

    def hand_back(self, rest: list[Child], countdown: float | None = None) -> None:
        """Each of its own run (they may be several runs')."""
        for child in rest:
            super().hand_back([child], countdown)

    def one(self, child: Child) -> float | None:
        took = super().one(child)
        if took is not None:
            note_child_seconds(child.template, took)
        return took


_slow_plans: set[str] = set()  # templates whose plan of several children took long here
SLOW_PLAN = 0.005  # seconds: a plan that long is not made twice (taken with others, then not)


def together(template: str) -> bool:
    """Whether ``template``'s one-child runs can be taken together: as ``run_master`` takes
    one (window dispatch, no operator's window), where this worker knows the template, no
    reduce follows the child, and no plan of several children of it took SLOW_PLAN in this
    process (the usual path plans such a run again)."""
    settings = services.current().settings
    return (
        template not in _slow_plans
        and _takeable(template)
        and settings.dispatch == "window"
        and settings.dispatch_window is None
    )


def _takeable(template: str) -> bool:
    return template in registry and registry.get(template).reduce is None


def run_many(store: Store, run_ids: list[int], siblings: int = 0) -> list[int]:
    """Take those of ``run_ids`` that are one child each and would start at once (and up to
    ``siblings`` more pending runs of the first one's template and priority: the pending runs
    a master of a short template takes with its own), in one transaction, and run their
    children here, their successes written together (``InMasters``); those of ``run_ids`` for
    their masters' usual path (``run_master``). A run already split is in neither."""
    settings = services.current().settings

    def plan(template: str, variables: dict[str, Any], slots: LiveSlots) -> list[Any] | None:
        if not _takeable(template):
            return None
        began = time.monotonic()
        with time_limit(settings.split_timeout, f"the split of template {template!r}"):
            specs = registry.get(template).plan(
                variables,
                settings.max_children,
                settings.max_child_spec,
                slots=partial(slots, settings.worker_seen_within),
            )
        if len(specs) != 1 and time.monotonic() - began >= SLOW_PLAN:
            _slow_plans.add(template)
        return specs

    claimed_at = time.monotonic()  # the children's leases run from no earlier than this
    taken, left = store.inline.split_many(run_ids, plan, owner_name(), settings.lease_ttl, siblings)
    children = [Child(r.run_id, 0, r.template, r.claim.spec, r.claim) for r in taken]
    InMasters(children, claimed_at).run()
    return left


class InMasters(InMaster):
    """The children of ``run_many``'s runs: a child's first start writes nothing (its attempt
    is counted with its end) while the split is young, and its success is held, then written
    with its run's in one transaction (``InlineStore.finish_many``) by the next start that
    must write, a heartbeat, or the end. A worker killed in between runs those children again
    (the writes are fenced: each counts once) without spending an attempt. Used by the pool
    process's thread and its child's heartbeat thread."""

    def __init__(self, children: list[Child], claimed_at: float) -> None:
        super().__init__(children)
        self.claimed_at = claimed_at
        self.held: list[tuple[Child, Finished]] = []
        self._lock = threading.Lock()

    def start(self, child: Child, claim: Claim, lease_ttl: float) -> Claim | None:
        if not claim.counted and time.monotonic() - self.claimed_at < unwritten_for():
            return claim
        self._flush()
        return super().start(child, claim, lease_ttl)

    def renew(self, child: Child, claim: Claim, lease_ttl: float) -> RunState | None:
        """Writes the successes held first: their leases run from the split."""
        self._flush()
        return super().renew(child, claim, lease_ttl)

    def finish(self, child: Child, done: Finished) -> None:
        with self._lock:
            self.held.append((child, done))

    def finalize(self, child: Child) -> None:
        """``close`` finishes the run with its child."""

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        """Never raises: where PostgreSQL cannot be reached, the children's leases run out and
        the reaper sends them again, as for a worker cut off."""
        store = services.store()
        ttl = services.current().settings.lease_ttl
        with self._lock:
            done, self.held = self.held, []
            if not done:
                return
            try:
                ended = patiently(
                    lambda: store.inline.finish_many([(c.run_id, d) for c, d in done]), ttl
                )
            except DatabaseUnavailable as exc:
                links.cut_off()
                log.warning(
                    "runs %s: finished children not written: %s; they run again once their"
                    " leases expire", [c.run_id for c, _ in done], exc,
                )  # fmt: skip
                return
        succeeded = set(ended.succeeded)
        for child, finished in done:
            if child.run_id not in succeeded:
                log.warning("%s: %s", child, lease_lost(finished.claim))
        for run_id in ended.chained:
            chains.after_finish(store, run_id)
        start_released(None, ended.released)
