"""An in-memory store behind the interfaces the child lifecycle, the batch path, the
dispatcher and dependencies use (dtask/worker/child_store.py ``LifecycleStore``,
dtask/worker/batch.py, dtask/worker/dispatcher.py): ``children`` as
``dtask.db.children.ChildStore`` (claims with fences, attempts, leases, checkpoints, finish,
failure, hand-back, a message's claims), ``runs`` as ``dtask.db.runs.RunStore``
(tests/support/memory_runs.py), ``dispatch``, ``clients`` and ``workers`` as the dispatcher
reads them (tests/support/memory_dispatch.py), ``recovery``'s settling of waiting runs
(tests/support/memory_deps.py). tests/contract runs one suite against this and PostgreSQL, so
it keeps the real store's semantics.

Each method is one atomic step under ``Tables.lock``, as each of the real store's is one
statement or transaction. Lease times are ``Tables.clock`` seconds (monotonic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from dtask import services
from dtask.db import ChildView, Claim, Finished, Redispatch, Refusal
from dtask.db.children import _exhausted, lease_lost
from dtask.db.steals import Gift
from dtask.domain.runs import ChildState, ClaimRefusal, RunState, refuse_claim
from dtask.exceptions import LeaseLost
from dtask.settings import Settings
from tests.support import memory_messages as messages
from tests.support.memory_deps import MemoryRecovery
from tests.support.memory_dispatch import MemoryClients, MemoryDispatch, MemoryWorkers
from tests.support.memory_rows import ChildRow, Tables, jsonb, loads
from tests.support.memory_runs import MemoryRuns


class MemoryChildren:
    """``ChildStore``'s lifecycle writes. ``written`` lists the fenced writes that went
    through, (method, child id), in order; ``before[method]`` is called with the claim before
    that write (a test's way to move the fence at a chosen moment)."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables
        self.written: list[tuple[str, int]] = []
        self.before: dict[str, Callable[[Claim], None]] = {}
        # (run, index, attempt) -> (state, output, characters before it not kept)
        self.logs: dict[tuple[int, int, int], tuple[str, str | None, int]] = {}

    def _claim(self, row: ChildRow, attempt: int | None = None, counted: bool = True) -> Claim:
        cap = self.t.runs[row.run_id].execution_cap
        return Claim(
            row.id, row.fence, row.attempt if attempt is None else attempt, row.max_attempts,
            jsonb(row.spec), jsonb(row.checkpoint), cap, counted,
        )  # fmt: skip

    def _take(self, row: ChildRow, owner: str, lease_ttl: float) -> None:
        now = self.t.clock()
        row.state, row.fence, row.owner = ChildState.RUNNING, row.fence + 1, owner
        row.lease_expires_at = now + lease_ttl
        row.started_at = row.started_at if row.started_at is not None else now

    def _holds(self, row: ChildRow, claim: Claim) -> bool:
        """The fenced writes' WHERE: ``fence = :mine AND state = 'running'``, or its
        message's fence for a child a message's claim covers."""
        if claim.message is not None:
            return messages.holds(self.t, row, claim)
        return row.fence == claim.fence and row.state is ChildState.RUNNING

    def _owned(self, claim: Claim, what: str) -> ChildRow:
        """The child while ``claim`` holds it; else LeaseLost."""
        row = self.t.children.get(claim.child_id)
        if row is None or not self._holds(row, claim):
            raise LeaseLost(lease_lost(claim))
        self.written.append((what, row.id))
        return row

    def _hook(self, what: str, claim: Claim) -> None:
        hook = self.before.get(what)
        if hook is not None:
            hook(claim)

    def claim(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal:
        with self.t.lock:
            row = self.t.child(run_id, index)
            if row is None:
                return Refusal(ClaimRefusal.GONE)
            if self.t.takeable(row):
                row.attempt = row.counted(1)
                self._take(row, owner, lease_ttl)
                return self._claim(row)
            active = self.t.active(run_id)
            reason = refuse_claim(
                row.state, row.attempt, row.max_attempts, self.t.leased(row), active
            )
            if reason is not ClaimRefusal.EXHAUSTED:
                return Refusal(reason, row.error)
            error = _exhausted(row.attempt, row.error)
            if self.t.free(row):
                self._fail(row, error)
                return Refusal(ClaimRefusal.FAILED, error)
            return Refusal(ClaimRefusal.BUSY)

    def _fail(self, row: ChildRow, error: str) -> None:
        row.state, row.error, row.owner = ChildState.FAILED, error, None
        row.lease_expires_at, row.finished_at = None, self.t.clock()

    def claim_many(
        self, run_id: int, indexes: list[int], owner: str, lease_ttl: float
    ) -> dict[int, Claim]:
        taken: dict[int, Claim] = {}
        with self.t.lock:
            held = messages.claim(self.t, run_id, indexes, owner, lease_ttl) if indexes else None
            if held is not None:
                m, covered = held
                return {
                    row.index: replace(
                        self._claim(row, row.attempt + 1, counted=False),
                        fence=m.fence,
                        message=m.id,
                    )
                    for row in covered
                }
            message = self.t.messages.get((run_id, min(indexes, default=-1)))
            if message is not None and message.claimed_at is None:
                message.claimed_at = self.t.clock()
            for index in sorted(set(indexes)):
                row = self.t.child(run_id, index)
                if row is None or not self.t.takeable(row):
                    continue
                self._take(row, owner, lease_ttl)
                first = row.fence == 1
                taken[index] = (
                    self._claim(row, row.attempt + 1, counted=False) if first else self._claim(row)
                )
        return taken

    def _start(self, claim: Claim, lease_ttl: float) -> Claim | None:
        row = self.t.children.get(claim.child_id)
        if claim.message is not None:  # nothing of its own: its message's lease renewed
            if row is None or not self._holds(row, claim):
                return None
            messages.left(self.t, row, claim, lease_ttl)
            return claim
        if row is None or not self._holds(row, claim) or row.attempt >= row.max_attempts:
            return None
        row.attempt = row.counted(1)
        now = self.t.clock()
        row.lease_expires_at = now + lease_ttl
        row.started_at = row.started_at if row.started_at is not None else now
        self.written.append(("start", row.id))
        return replace(claim, attempt=row.attempt, counted=True)

    def start(self, claim: Claim, lease_ttl: float) -> Claim | None:
        self._hook("start", claim)
        with self.t.lock:
            return self._start(claim, lease_ttl)

    def _succeed(
        self,
        row: ChildRow,
        checkpoint: Any | None,
        result: str | None,
        counts: int,
        output: str | None = None,
    ) -> None:
        row.attempt = row.counted(counts)
        now = self.t.clock()
        row.state, row.finished_at, row.owner, row.lease_expires_at = (
            ChildState.SUCCEEDED, now, None, None,
        )  # fmt: skip
        if checkpoint is not None:
            row.checkpoint = jsonb(checkpoint)
        row.error = row.traceback = None
        row.output = output
        row.result = loads(result)
        row.started_at = row.started_at if row.started_at is not None else now

    def write_batch(
        self, done: list[Finished], claim: Claim | None, lease_ttl: float
    ) -> tuple[set[int], Claim | None]:
        for d in done:
            self._hook("finish", d.claim)
        with self.t.lock:
            rows = [(self.t.children.get(d.claim.child_id), d) for d in done]
            ours = [(r, d) for r, d in rows if r is not None and self._holds(r, d.claim)]
            for row, d in ours:  # one statement: a CHECK broken by any one refuses them all
                row.counted(d.claim.uncounted)
            for row, d in ours:
                self._succeed(row, d.checkpoint, d.result, d.claim.uncounted, d.output)
                messages.left(self.t, row, d.claim, lease_ttl)
                self.written.append(("finish", row.id))
            written = {row.id for row, _ in ours}
            started = None if claim is None else self._start(claim, lease_ttl)
        return written, started

    def close(self, claim: Claim) -> list[Redispatch]:
        with self.t.lock:
            m = self.t.message(claim.message)
            if m is None or m.fence != claim.fence:
                return []
            return messages.let_go(self.t, m)

    def unclaim(self, claim: Claim) -> None:
        with self.t.lock:
            row = self._owned(claim, "unclaim")
            row.state, row.owner, row.lease_expires_at = ChildState.PENDING, None, None
            row.sent_at = self.t.clock()
            messages.left(self.t, row, claim)

    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float, ran: float = 0.0) -> bool:
        self._hook("checkpoint", claim)
        with self.t.lock:
            row = self._owned(claim, "checkpoint")
            row.checkpoint = jsonb(state)
            if row.started_at is None:
                row.started_at = self.t.clock() - ran
            row.lease_expires_at = self.t.clock() + lease_ttl
            messages.left(self.t, row, claim, lease_ttl)
            return row.give_away

    def give_away(
        self, claim: Claim, run_id: int, keys: tuple[str, str], end: int, at: int, deferred: bool
    ) -> Gift | None:
        self._hook("give_away", claim)
        a_key, b_key = keys
        with self.t.lock:
            row = self._owned(claim, "give_away")
            if row.spec.get(b_key) != end or not row.spec.get(a_key, at) < at:
                raise LeaseLost(f"run {run_id}: a child's range changed under its fence")
            run = self.t.runs[run_id]
            if run.state is not RunState.RUNNING:
                return None
            assert run.child_total is not None and run.chord_size is not None
            spec = {**row.spec, a_key: at, b_key: end}
            row.spec = {**row.spec, b_key: at - 1}
            row.give_away, row.cuts = False, row.cuts + 1
            index = run.child_total
            run.child_total, run.chord_size = run.child_total + 1, run.chord_size + 1
            run.unsent += 1 if deferred else 0
            child = ChildRow(max(self.t.children) + 1, run_id, index, spec, row.max_attempts)
            child.cuts, child.sent_at = row.cuts, None if deferred else self.t.clock()
            self.t.children[child.id] = child
            return Gift(index, spec, run.template, run.group_id, run.chord_size)

    def finish(
        self,
        claim: Claim,
        final_checkpoint: Any | None,
        result: str | None = None,
        output: str | None = None,
    ) -> None:
        self._hook("finish", claim)
        with self.t.lock:
            row = self._owned(claim, "finish")
            self._succeed(row, final_checkpoint, result, claim.uncounted, output)
            messages.left(self.t, row, claim)

    def note_time(self, run_id: int, seconds: float) -> bool:
        with self.t.lock:
            run = self.t.runs.get(run_id)
            if run is None:
                return False
            before = run.child_seconds
            run.child_seconds = seconds if before is None else 0.7 * before + 0.3 * seconds
            return before is None and run.unsent > 0

    def any_unfinished(self, run_id: int) -> bool:
        with self.t.lock:
            return any(not c.state.finished for c in self.t.of_run(run_id))

    def fail_attempt(
        self,
        claim: Claim,
        error: str,
        traceback: str | None = None,
        output: str | None = None,
        final: bool = False,
        skipped: int = 0,
    ) -> ChildState:
        self._hook("fail_attempt", claim)
        with self.t.lock:
            row = self._owned(claim, "fail_attempt")
            row.attempt = row.counted(claim.uncounted)
            now = self.t.clock()
            if final:
                why = f"not retried (a permanent error) at attempt {row.attempt}: {error}"
                self._fail(row, why)
            elif row.attempt >= row.max_attempts:
                self._fail(row, f"gave up after {row.attempt} attempt(s): {error}")
            else:
                row.state, row.error, row.finished_at = ChildState.PENDING, error, None
            row.started_at = row.started_at if row.started_at is not None else now
            row.traceback, row.output = traceback, output
            row.owner, row.lease_expires_at, row.sent_at = None, None, now
            messages.left(self.t, row, claim)
            self.logs[(row.run_id, row.index, claim.attempt)] = ("failed", output, skipped)
            return row.state

    def write_log(
        self, run_id: int, index: int, attempt: int, worker: str, kept: tuple[str | None, int]
    ) -> None:
        with self.t.lock:
            self.logs[(run_id, index, attempt)] = ("running", *kept)

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None:
        with self.t.lock:
            row = self.t.children.get(claim.child_id)
            if row is None or not self._holds(row, claim):
                return None
            if claim.message is not None:
                messages.left(self.t, row, claim, lease_ttl)
            else:
                row.lease_expires_at = self.t.clock() + lease_ttl
            return self.t.runs[row.run_id].state

    def release(self, claim: Claim, checkpoint: Any | None) -> None:
        self._hook("release", claim)
        with self.t.lock:
            row = self._owned(claim, "release")
            row.attempt = row.counted(-int(claim.counted))
            row.state, row.owner, row.lease_expires_at = ChildState.PENDING, None, None
            if checkpoint is not None:
                row.checkpoint = jsonb(checkpoint)
            row.sent_at = self.t.clock()
            messages.left(self.t, row, claim)

    def revoke(self, run_id: int, index: int, error: str) -> bool:
        with self.t.lock:
            row = self.t.child(run_id, index)
            if row is None or row.state.finished:
                return False
            covering = self.t.holder(row)
            if covering is not None:
                covering.children -= 1
            self._fail(row, error)
            row.sent_at = row.sent_at if row.sent_at is not None else self.t.clock()
            return True

    def error(self, run_id: int, index: int) -> str | None:
        with self.t.lock:
            row = self.t.child(run_id, index)
            return None if row is None else row.error

    def view(self, run_id: int, index: int) -> ChildView | None:
        with self.t.lock:
            row = self.t.child(run_id, index)
            if row is None:
                return None
            m = self.t.holder(row)
            seen = row.view()
            if m is None:
                return seen
            return replace(
                seen, state=ChildState.RUNNING, attempt=max(seen.attempt, 1), owner=m.owner
            )


class MemoryStore:
    """The store's parts over one set of tables (a ``LifecycleStore``, and what the
    dispatcher and dependencies use)."""

    def __init__(self, tables: Tables | None = None) -> None:
        self.tables = tables or Tables()
        self.children = MemoryChildren(self.tables)
        self.workers = MemoryWorkers()
        self.runs = MemoryRuns(self.tables, self.workers)
        self.dispatch = MemoryDispatch(self.tables, self.workers)
        self.clients = MemoryClients(self.tables)
        self.recovery = MemoryRecovery(self.tables)

    def row(self, run_id: int, index: int) -> ChildRow:
        """A child's row as it is (a test reads it, or sets it up)."""
        row = self.tables.child(run_id, index)
        assert row is not None, f"no child {index} in run {run_id}"
        return row

    def take_over(self, run_id: int, index: int, owner: str = "another worker") -> Claim:
        """Another worker takes the child, as it would once its lease looked expired: the
        fence moves (and the attempt is counted)."""
        with self.tables.lock:
            self.row(run_id, index).lease_expires_at = self.tables.clock() - 1
            taken = self.children.claim(run_id, index, owner, 30)
        assert isinstance(taken, Claim), taken
        return taken


@dataclass
class Sent:
    """What went to the broker instead: hand-overs and resends (``publish``), chords forgotten."""

    published: list[tuple[int, int]]
    forgotten: list[str]


def install(monkeypatch: pytest.MonkeyPatch, store: MemoryStore, settings: Settings) -> Sent:
    """This process's services are ``store`` and ``settings`` (nothing is started), and what
    would go to the broker or the result backend is recorded in the ``Sent`` returned."""
    from dtask.worker import batch, child_store, finalize

    resolved = services.Services(settings, "memory://", "memory://", "memory://")
    sent = Sent([], [])

    def publish(children: list[Any], countdown: float | None = None) -> None:
        sent.published.extend((c.run_id, c.index) for c in children)

    monkeypatch.setattr(services, "current", lambda: resolved)
    monkeypatch.setattr(services, "store", lambda: store)
    monkeypatch.setattr(child_store, "publish", publish)
    monkeypatch.setattr(batch, "publish", publish)
    monkeypatch.setattr(finalize, "forget_chord", sent.forgotten.append)
    return sent
