"""The dispatcher's store in memory (``dtask.db.dispatch``): one turn at a time, lost once held
idle past its limit; in a turn, the runs with unsent children (the head of each client's runs
of one template in one queue), what is out per queue and client, the clients' shares, and
taking a run's next children. What a turn took is kept when it ends, undone when it ends in an
exception or was lost, as the real turn's transaction is committed or rolled back. And the
clients' rows and the live workers the dispatcher reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from dtask.db import WorkerInfo
from dtask.db.clients import _client_or_default
from dtask.db.dispatch import HOLD, RUNS_PER_CLIENT, TURN_POLL, Out
from dtask.db.recovery import Redispatch
from dtask.domain.clients import Client
from dtask.domain.dispatch import Demand, Share, messages
from dtask.domain.runs import ChildState, RunState
from dtask.exceptions import LeaseLost
from tests.support.memory_rows import MessageRow, RunRow, Tables, jsonb

LOST = (
    "the dispatcher's turn ended: held past its limit (this worker was paused, or the"
    " pass ran long); another worker dispatches now"
)


class MemoryPass:
    """One turn (``DispatchPass``). Each method is one statement: it fails with LeaseLost once
    the turn sat idle ``hold_for`` seconds since the last (PostgreSQL ended the transaction)."""

    def __init__(self, dispatch: MemoryDispatch, hold_for: float) -> None:
        self.d, self.t = dispatch, dispatch.t
        self.hold_for = hold_for
        self.touched = self.t.clock()
        self.lost = False
        self._undo: list[tuple[Any, str, Any]] = []
        self._added: list[tuple[int, int]] = []  # messages' keys, deleted if rolled back

    def idle_too_long(self) -> bool:
        return self.t.clock() - self.touched > self.hold_for

    def live_workers(self, within: float) -> list[WorkerInfo]:
        return self.d.workers.live(within)

    def lose(self) -> None:
        """The transaction ends unfinished: what it wrote is rolled back, the turn is free."""
        for row, column, value in reversed(self._undo):
            setattr(row, column, value)
        for key in self._added:
            self.t.messages.pop(key, None)
        self._undo.clear()
        self._added.clear()
        self.lost = True
        if self.d.holder is self:
            self.d.holder = None

    def commit(self) -> None:
        with self._statement():
            self._undo.clear()
            self._added.clear()
            self.d.holder = None

    @contextmanager
    def _statement(self) -> Iterator[None]:
        with self.t.lock:
            if not self.lost and self.idle_too_long():
                self.lose()
            if self.lost:
                raise LeaseLost(LOST)
            yield
            self.touched = self.t.clock()

    def _set(self, row: Any, column: str, value: Any) -> None:
        self._undo.append((row, column, getattr(row, column)))
        setattr(row, column, value)

    def demands(self, per_client: int | None = None) -> dict[str | None, list[Demand]]:
        head = RUNS_PER_CLIENT if per_client is None else per_client
        with self._statement():
            groups: dict[tuple[str, str, str], list[RunRow]] = {}
            for run in self.t.runs.values():
                if run.unsent > 0 and run.state is RunState.RUNNING:
                    groups.setdefault((run.client, run.queue or "", run.template), []).append(run)
            found: dict[str | None, list[Demand]] = {}
            for group in sorted(groups):
                for r in sorted(groups[group], key=_order)[:head]:
                    demand = Demand(
                        r.id, r.client, r.priority, r.deadline, r.unsent, r.child_seconds,
                        r.template, r.child_total or 0,
                    )  # fmt: skip
                    found.setdefault(r.queue, []).append(demand)
            return found

    def out(
        self, runnable: Callable[[str | None, str], bool] = lambda queue, template: True
    ) -> tuple[dict[str | None, Out], dict[str, int]]:
        with self._statement():
            counted: dict[tuple[str | None, str, str], tuple[int, int]] = {}
            for c in self.t.children.values():
                run = self.t.runs.get(c.run_id)
                if run is None:
                    continue
                active = run.state is RunState.RUNNING
                queued = active and c.state is ChildState.PENDING and c.sent_at is not None
                running = c.state is ChildState.RUNNING and c.lease_expires_at is not None
                if not (queued or running):
                    continue
                key = (run.queue, run.client, run.template)
                q, r = counted.get(key, (0, 0))
                counted[key] = (q + queued, r + running)
            for m in self.t.messages.values():
                run = self.t.runs.get(m.run_id)
                if m.claimed_at is None and run is not None and run.state is RunState.RUNNING:
                    key = (run.queue, run.client, run.template)
                    q, r = counted.get(key, (0, 0))
                    counted[key] = (q + m.children, r)
                elif m.owner is not None and run is not None:  # the children it covers run
                    key = (run.queue, run.client, run.template)
                    q, r = counted.get(key, (0, 0))
                    counted[key] = (q, r + m.children)
            queues: dict[str | None, Out] = {}
            clients: dict[str, int] = {}
            for (queue, client, template), (q, r) in counted.items():
                if not (q or r) or not runnable(queue, template):
                    continue
                seen = queues.get(queue, Out(0, 0))
                queues[queue] = Out(seen.queued + q, seen.running + r)
                clients[client] = clients.get(client, 0) + q + r
            return queues, clients

    def shares(self, names: set[str], out: dict[str, int]) -> dict[str, Share]:
        with self._statement():
            clients = {n: self.t.clients.get(n) or Client(n) for n in names}
            return {n: Share(c.weight, c.max_running, out.get(n, 0)) for n, c in clients.items()}

    def take(self, run_id: int, count: int, batch: int = 1) -> list[list[Redispatch]]:
        with self._statement():
            run = self.t.runs.get(run_id)
            if run is None:
                return []
            read = [c for c in self.t.of_run(run_id) if c.index >= run.sent_through][:count]
            taken, now = [c for c in read if c.state is ChildState.PENDING], self.t.clock()
            assert run.group_id is not None
            children = [
                Redispatch(run_id, c.index, jsonb(c.spec), run.template, run.group_id, run.queue)
                for c in taken
            ]
            groups, at = [], 0
            for size in messages([len(json.dumps(c.spec)) for c in taken], batch):
                group = children[at : at + size]
                if size == 1:
                    self._set(taken[at], "sent_at", now)
                else:
                    self._add_message(
                        MessageRow(run_id, group[0].index, group[-1].index, size, now)
                    )
                groups.append(group)
                at += size
            if read:
                self._set(run, "sent_through", max(run.sent_through, read[-1].index + 1))
            left = run.unsent - count
            if len(taken) != count:  # the count was off: count again
                unsent = [c for c in self.t.of_run(run_id) if c.index >= run.sent_through]
                left = sum(c.state is ChildState.PENDING and c.sent_at is None for c in unsent)
            self._set(run, "unsent", max(left, 0))
            return groups

    def _add_message(self, row: MessageRow) -> None:
        key = (row.run_id, row.lo)
        row.id = next(self.t.message_ids)  # an identity: never reused, as PostgreSQL's
        self._added.append(key)
        self.t.messages[key] = row


def _order(run: RunRow) -> tuple[int, bool, datetime, int]:
    """ORDER BY priority DESC, deadline ASC NULLS LAST, id."""
    never = datetime.max.replace(tzinfo=UTC)
    return (-run.priority, run.deadline is None, run.deadline or never, run.id)


class MemoryDispatch:
    """``DispatchStore``: ``holder`` is the pass holding the turn (the advisory lock)."""

    def __init__(self, tables: Tables, workers: MemoryWorkers) -> None:
        self.t = tables
        self.workers = workers
        self.holder: MemoryPass | None = None

    def _try(self, mine: MemoryPass) -> bool:
        with self.t.lock:
            held = self.holder
            if held is not None and not held.idle_too_long():
                return False
            if held is not None:
                held.lose()
            self.holder, mine.touched = mine, self.t.clock()
            return True

    @contextmanager
    def turn(self, hold_for: float = HOLD, wait: float = 0.0) -> Iterator[MemoryPass | None]:
        mine = MemoryPass(self, hold_for)
        deadline = time.monotonic() + wait
        while not self._try(mine):
            if time.monotonic() >= deadline:
                yield None
                return
            time.sleep(TURN_POLL)
        try:
            yield mine
        except BaseException:
            with self.t.lock:
                mine.lose()
            raise
        mine.commit()


class MemoryClients:
    """``ClientStore``'s rows: ``save`` and ``get`` (without usage)."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables

    def save(self, client: Client) -> None:
        with self.t.lock:
            self.t.clients[client.name] = client

    def get(self, name: str) -> Client:
        with self.t.lock:
            return self.t.clients.get(name) or _client_or_default(None, name)


class MemoryWorkers:
    """The live workers (``WorkerStore.live``): those a test says are up."""

    def __init__(self) -> None:
        self.up: list[WorkerInfo] = []

    def report(
        self,
        name: str,
        queues: Sequence[str],
        slots: int,
        pid: int,
        busy: int,
        templates: Sequence[str] | None = None,
    ) -> None:
        known = None if templates is None else tuple(sorted(templates))
        now = datetime.now(UTC)
        self.up = [w for w in self.up if w.name != name]
        info = WorkerInfo(name, tuple(sorted(queues)), slots, pid, now, 0.0, busy, None, known)
        self.up.append(info)

    def leave(self, name: str) -> None:
        self.up = [w for w in self.up if w.name != name]

    def live(self, within: float) -> list[WorkerInfo]:
        return sorted(self.up, key=lambda w: w.name)
