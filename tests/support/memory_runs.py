"""``RunStore`` in memory (tests/support/memory.py's ``runs``): a run created once per client
and key (charged to its client: tier, queue, priority; waiting for its upstreams), split (its
children sent with its chord, or left to the dispatcher; a lone child taken by its master when
nothing competes), dispatched, cancelled, rerun and finalized, each settling its dependents
(tests/support/memory_deps.py); its status as an operator reads it. Left out, as no caller of
it reaches them here: rate limits, countdowns, Celery chains, notifications, retention."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from dtask.db import Claim, Finished, RunRecord
from dtask.db.children import lease_lost
from dtask.db.clients import _client_or_default
from dtask.db.inline import Inline
from dtask.db.run_reads import Graph
from dtask.db.runs import Chained, Reducer
from dtask.db.workers import LiveSlots
from dtask.domain.clients import DEFAULT_CLIENT
from dtask.domain.deps import Node, blocking, start_state
from dtask.domain.runs import ChildCounts, ChildState, NewRun, RunState, RunStatus, outcome
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.exceptions import (
    DtaskError,
    KeyConflict,
    LeaseLost,
    RunNotFound,
    UnknownTemplate,
    UpstreamFailed,
    UpstreamNotFound,
)
from tests.support import memory_deps as deps
from tests.support.memory_dispatch import MemoryWorkers
from tests.support.memory_rows import ChildRow, RunRow, Tables, jsonb, loads

Send = Callable[[RunRecord, list[tuple[int, dict[str, Any]]]], None]


class MemoryRuns:
    """``finalized`` lists the runs asked to finalize."""

    def __init__(self, tables: Tables, workers: MemoryWorkers) -> None:
        self.t = tables
        self.workers = workers
        self.finalized: list[int] = []
        self._ids = itertools.count(1)
        self._child_ids = itertools.count(1)
        self._keys = itertools.count(1)

    def add(
        self,
        template: str,
        specs: Sequence[Mapping[str, Any]],
        max_attempts: int,
        execution_cap: float | None = None,
        variables: dict[str, Any] | None = None,
    ) -> int:
        """A run created and split (its children sent with its chord), not dispatched."""
        new = NewRun(
            template, f"memory:{next(self._keys)}", variables or {}, max_attempts, None,
            execution_cap=execution_cap,
        )  # fmt: skip
        run_id, _ = self.create(new)
        assert self.split(run_id, lambda run, slots: list(specs)) is RunState.SPLITTING
        return run_id

    def create(self, run: NewRun) -> tuple[int, bool]:
        if run.concurrency_key:  # its admission is PostgreSQL's (tests/acceptance)
            raise NotImplementedError("the memory store has no concurrency keys")
        with self.t.lock:
            existing = self._by_key(run.client, run.key)
            if existing is None:
                client = self.t.clients.get(run.client) or _client_or_default(None, run.client)
                state, error = deps.initial_state(self.t, run.after)
                if run.unmet is not None:
                    state, error = RunState.FAILED, run.unmet
                charged = run.charged_to(client)
                assert charged.priority is not None and charged.tier is not None
                row = RunRow(
                    next(self._ids), run.template, run.key, jsonb(run.variables),
                    run.max_attempts, run.execution_cap, state=state, error=error,
                    client=charged.client, priority=charged.priority, queue=charged.queue,
                    tier=charged.tier, deadline=_deadline(run), after=tuple(sorted(set(run.after))),
                )  # fmt: skip
                row.finished_at = row.created_at if state.finished else None
                self.t.runs[row.id] = row
                return row.id, True
        differs = [
            what
            for what, same in (
                ("template", existing.template == run.template),
                ("variables", existing.variables == run.variables),
                ("upstream runs (after)", list(existing.after) == sorted(set(run.after))),
            )
            if not same
        ]
        if differs:
            raise KeyConflict(
                f"key {run.key!r} already triggered run {existing.id} with different"
                f" {' and '.join(differs)}; use another key for another run"
            )
        return existing.id, False

    def _by_key(self, client: str, key: str) -> RunRow | None:
        return next((r for r in self.t.runs.values() if (r.client, r.key) == (client, key)), None)

    def _run(self, run_id: int) -> RunRow:
        run = self.t.runs.get(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id}")
        return run

    def get(self, run_id: int) -> RunRecord:
        with self.t.lock:
            return self._run(run_id).record()

    def unsplit(self, run_ids: list[int]) -> list[int]:
        waiting = (RunState.PENDING, RunState.SPLITTING)
        with self.t.lock:
            return [i for i in run_ids if (r := self.t.runs.get(i)) and r.state in waiting]

    def split(
        self,
        run_id: int,
        plan: Callable[[RunRecord, LiveSlots], Sequence[str | Mapping[str, Any]]],
        wait: bool = True,
        deferred: bool = False,
        offer: Inline | None = None,
    ) -> RunState:
        with self.t.lock:
            run = self._run(run_id)
            if run.state is not RunState.PENDING:
                return run.state
            slots = LiveSlots(self.workers.live, run.queue, run.template)
            try:
                planned = plan(run.record(), slots)
                specs = [loads(s) if isinstance(s, str) else jsonb(s) for s in planned]
            except DtaskError as exc:
                deps.move(self.t, run, RunState.FAILED, error=str(exc))
                return RunState.FAILED
            run.split_slots = slots.seen
            if offer is not None and deferred and len(specs) == 1 and self._alone(run):
                self._take_alone(run, specs[0], offer)
                return RunState.RUNNING
            now = self.t.clock()
            for index, spec in enumerate(specs):
                self._child(run, index, spec, None if deferred else now)
            self._split(run, RunState.SPLITTING, len(specs), len(specs) if deferred else 0)
            return RunState.SPLITTING

    def refresh_statistics(self, children: int) -> None:
        """Nothing to plan here."""

    def _child(self, run: RunRow, index: int, spec: Any, sent_at: float | None) -> ChildRow:
        child = ChildRow(next(self._child_ids), run.id, index, spec, run.max_attempts)
        child.sent_at = sent_at
        self.t.children[child.id] = child
        return child

    @staticmethod
    def _split(run: RunRow, state: RunState, total: int, unsent: int) -> None:
        run.state, run.child_total, run.chord_size, run.unsent = state, total, total, unsent
        run.dispatches += 1
        run.group_id = f"dtask-{run.id}-{run.dispatches}"

    def _alone(self, run: RunRow) -> bool:
        """``inline.take``'s WHERE: nothing for the dispatcher to weigh the run against."""
        client = self.t.clients.get(run.client)
        return (
            (run.queue or DEFAULT_QUEUE) == DEFAULT_QUEUE
            and (client is None or client.max_running is None)
            and not any(
                o.unsent > 0
                and o.state is RunState.RUNNING
                and (o.queue or DEFAULT_QUEUE) == DEFAULT_QUEUE
                and o.priority > run.priority
                for o in self.t.runs.values()
            )
        )

    def _take_alone(self, run: RunRow, spec: Any, offer: Inline) -> None:
        self._split(run, RunState.RUNNING, 1, 0)
        child = self._child(run, 0, spec, self.t.clock())
        child.state, child.fence, child.owner = ChildState.RUNNING, 1, offer.owner
        child.lease_expires_at = self.t.clock() + offer.lease_ttl
        claim = Claim(child.id, 1, 0, child.max_attempts, jsonb(spec), None, run.execution_cap)
        offer.taken.append((0, claim))
        offer.template = run.template

    def dispatch(
        self, run_id: int, send: Send, wait: bool = True, deferred: bool = False
    ) -> RunState:
        with self.t.lock:
            run = self._run(run_id)
            if run.state is not RunState.SPLITTING:
                return run.state
            now, children = self.t.clock(), self.t.of_run(run_id)
            pending = [c for c in children if c.state is ChildState.PENDING]
            if deferred:
                for c in pending:
                    c.sent_at = None
                for key in [k for k in self.t.messages if k[0] == run_id]:
                    del self.t.messages[key]
                run.unsent, run.sent_through = len(pending), 0
                send(run.record(), [])
            else:  # sent now: children split long ago must not look lost
                for c in pending:
                    if c.sent_at is not None and c.sent_at < now - 1:
                        c.sent_at = now
                send(run.record(), [(c.index, c.spec) for c in children if not c.state.finished])
            run.state = RunState.RUNNING
            return RunState.RUNNING

    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool:
        """No run here keeps Celery chains (``add_chain`` is not reached): nothing to send."""
        return False

    def cancel(self, run_id: int, terminate: bool = False) -> RunState:
        with self.t.lock:
            run = self._run(run_id)
            if not run.state.finished:
                deps.move(self.t, run, RunState.CANCELLED, error="cancelled")
                run.terminate = terminate
            return run.state

    def terminating(self, run_id: int) -> bool:
        with self.t.lock:
            run = self._run(run_id)
            return run.state is RunState.CANCELLED and run.terminate

    def rerun(self, run_id: int) -> RunState:
        with self.t.lock:
            run = self._run(run_id)
            if run.state not in (RunState.FAILED, RunState.CANCELLED):
                return run.state
            if run.child_total is None:  # never split: it waits for its upstreams again
                upstreams = deps.upstream_states(self.t, run.after)
                state, error = start_state(upstreams)
                upstream = blocking(upstreams)
                if upstream is not None:
                    raise UpstreamFailed(
                        f"run {run_id} cannot run: {error}; rerun that one first"
                        f" (dtask rerun {upstream}), then this one"
                    )
                deps.move(self.t, run, state)
                return state
            children = self.t.of_run(run_id)
            for c in children:
                if c.state is ChildState.FAILED:
                    c.state, c.attempt, c.error, c.finished_at = ChildState.PENDING, 0, None, None
            run.state, run.error, run.finished_at = RunState.SPLITTING, None, None
            run.dispatches += 1
            run.group_id = f"dtask-{run.id}-{run.dispatches}"
            run.chord_size = sum(c.state is not ChildState.SUCCEEDED for c in children)
            return RunState.SPLITTING

    def finish_alone(
        self,
        run_id: int,
        done: Finished,
        chained: list[int] | None = None,
    ) -> list[int] | None:
        """A lone child's success and its run's, in one step (``inline.finish``)."""
        claim, checkpoint, result = done.claim, done.checkpoint, done.result
        with self.t.lock:
            child = self.t.children.get(claim.child_id)
            if child is None or (child.fence, child.state) != (claim.fence, ChildState.RUNNING):
                raise LeaseLost(lease_lost(claim))
            child.state, child.finished_at = ChildState.SUCCEEDED, self.t.clock()
            child.owner = child.lease_expires_at = None
            child.error = child.traceback = None
            child.output = done.output
            if checkpoint is not None:
                child.checkpoint = jsonb(checkpoint)
            child.result = loads(result)
            run = self.t.runs.get(run_id)
            if run is None or run.state is not RunState.RUNNING:
                return None
            if any(c.state is not ChildState.SUCCEEDED for c in self.t.of_run(run_id)):
                return None
            run.state, run.error, run.result = RunState.SUCCEEDED, None, None
            run.finished_at = datetime.now(UTC)
            return deps.settle(self.t, run_id, RunState.SUCCEEDED)

    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = lambda template: True,
    ) -> RunState:
        self.finalized.append(run_id)
        with self.t.lock:
            run = self._run(run_id)
            if run.state.finished:
                return run.state
            states = [c.state.value for c in self.t.of_run(run_id)]
            final = outcome(ChildCounts.from_states(Counter(states)))
            if final is None:
                return run.state
            record, dispatches = run.record(), run.dispatches
            results = [c.result for c in self.t.of_run(run_id)]
        error, result = None, None
        if final is RunState.SUCCEEDED and reduce is not None and reduces(run.template):
            try:  # outside the lock, as the real store runs the reduce outside its transaction
                result = loads(reduce(record, lambda: results))
            except UnknownTemplate:
                return record.state
            except DtaskError as exc:
                final, error = RunState.FAILED, str(exc)
        with self.t.lock:
            if run.dispatches != dispatches:
                return run.state
            if final is RunState.FAILED and error is None:
                error = self.t.failure_summary(run_id)
            settled = deps.move(self.t, run, final, error, result)
            if settled is None:
                return run.state
            if released is not None:
                released.extend(settled)
            if ended is not None and run.group_id is not None:
                ended.append(run.group_id)
            return final

    def status(self, run_id: int) -> RunStatus:
        with self.t.lock:
            run = self.t.runs.get(run_id)
            if run is None:
                raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
            counts = ChildCounts.from_states(
                Counter(
                    ChildState.RUNNING.value if self.t.holder(c) else c.state.value
                    for c in self.t.of_run(run_id)
                )
            )
            after, unfinished = deps.waiting_for(self.t, run)
            return RunStatus(
                run.id, run.template, run.key, run.state, jsonb(run.variables), counts,
                run.created_at, run.finished_at, run.error, client=run.client,
                priority=run.priority, deadline=run.deadline, result=jsonb(run.result),
                tier=run.tier, after=tuple(after), waiting_for=tuple(unfinished),
                slots=run.split_slots,
            )  # fmt: skip

    def graph(self, run_id: int) -> Graph:
        with self.t.lock:
            up = deps.edges(self.t, run_id, upstream=True)
            down = deps.edges(self.t, run_id, upstream=False)
            ids = {run_id} | {i for e in (up, down) for a, bs in e.items() for i in (a, *bs)}
            nodes = {i: Node(i, r.template, r.state) for i in ids if (r := self.t.runs.get(i))}
        if run_id not in nodes:
            raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
        return Graph(run_id, nodes, up, down)

    def ids_by_key(self, keys: Sequence[str], client: str = DEFAULT_CLIENT) -> dict[str, int]:
        with self.t.lock:
            found = {k: run.id for k in keys if (run := self._by_key(client, k)) is not None}
        missing = [k for k in keys if k not in found]
        if missing:
            raise UpstreamNotFound(
                f"after: no run with the key {missing[0]!r}; a run can only wait for runs"
                " that exist (see `dtask runs`)"
            )
        return found

    def forget_unsent(self, run_id: int) -> bool:
        with self.t.lock:
            run = self.t.runs.get(run_id)
            kept = any(run_id in r.after for r in self.t.runs.values())
            if run is None or run.state is not RunState.PENDING or kept:
                return False
            del self.t.runs[run_id]
            return True


def _deadline(run: NewRun) -> datetime | None:
    """The submit's (or slot's, or start's) time plus its delay tolerance."""
    if run.delay_tolerance is None:
        return None
    now = datetime.now(UTC)
    later = None if run.start_in is None else now + timedelta(seconds=run.start_in)
    return (run.slot or run.start_at or later or now) + timedelta(seconds=run.delay_tolerance)
