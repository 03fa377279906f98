"""Dependencies between runs in the in-memory store, as dtask/db/deps.py keeps them in
PostgreSQL: a run's move to a state and what it settles (its waiting dependents released when
every upstream has succeeded, failed level by level with the whole waiting downstream when it
failed or was cancelled), and the reaper's safety net (``settle_waiting``). The caller holds
``Tables.lock``: each function is part of one transaction of the real store."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from dtask.db import Redispatch
from dtask.domain.deps import start_state, upstream_error
from dtask.domain.runs import ChildState, RunState, sources
from dtask.exceptions import UpstreamNotFound
from tests.support import memory_messages as messages
from tests.support.memory_rows import RunRow, Tables, jsonb


def upstream_states(t: Tables, ids: Sequence[int]) -> dict[int, RunState]:
    """``deps.lock_upstreams``: each upstream's state (UpstreamNotFound names the first missing)."""
    missing = [i for i in ids if i not in t.runs]
    if missing:
        raise UpstreamNotFound(
            f"after: no run with id {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; a run can only wait for runs that exist (see `dtask runs`)"
        )
    return {i: t.runs[i].state for i in sorted(ids)}


def initial_state(t: Tables, ids: Sequence[int]) -> tuple[RunState, str | None]:
    return start_state(upstream_states(t, ids)) if ids else (RunState.PENDING, None)


def move(
    t: Tables, run: RunRow, state: RunState, error: str | None = None, result: object = None
) -> list[int] | None:
    """``RunStore._set_run_state``: None if the run cannot move to ``state``; else the
    dependents that released."""
    if run.state.value not in sources(state):
        return None
    run.state, run.error, run.result = state, error, result
    run.finished_at = datetime.now(UTC) if state.finished else None
    return settle(t, run.id, state) if state.finished else []


def settle(t: Tables, run_id: int, state: RunState) -> list[int]:
    if state is RunState.SUCCEEDED:
        return release(t, [r.id for r in _waiting(t) if run_id in r.after])
    if state in (RunState.FAILED, RunState.CANCELLED):
        fail_downstream(t, run_id, state)
    return []


def _waiting(t: Tables) -> list[RunRow]:
    return sorted((r for r in t.runs.values() if r.state is RunState.WAITING), key=_id)


def _id(run: RunRow) -> int:
    return run.id


def _succeeded(t: Tables, upstream: int) -> bool:
    """The release's NOT EXISTS joins the upstream's row: a deleted upstream holds nothing."""
    run = t.runs.get(upstream)
    return run is None or run.state is RunState.SUCCEEDED


def release(t: Tables, candidates: Sequence[int]) -> list[int]:
    released = []
    for run_id in sorted(set(candidates)):
        run = t.runs.get(run_id)
        waiting = run is not None and run.state is RunState.WAITING
        if run is not None and waiting and all(_succeeded(t, u) for u in run.after):
            run.state = RunState.PENDING
            released.append(run_id)
    return released


def fail_downstream(t: Tables, run_id: int, state: RunState) -> int:
    """The waiting runs after ``run_id``, then theirs, level by level, each naming the lowest
    upstream of the level before it waited for."""
    below, frontier = {run_id}, [run_id]
    while frontier:  # the whole downstream, waiting or not, as the recursive CTE walks it
        frontier = [r.id for r in t.runs.values() if set(r.after) & set(frontier)]
        frontier = [i for i in frontier if i not in below]
        below.update(frontier)
    locked = {r.id for r in _waiting(t) if r.id in below - {run_id}}
    failed, frontier = 0, [run_id]
    while frontier and locked:
        level = []
        for run in _waiting(t):
            ups = [u for u in run.after if u in frontier]
            if run.id in locked and ups:
                first = min(ups)
                error = (
                    upstream_error(run_id, state)
                    if first == run_id
                    else f"upstream run {first} failed"
                )
                run.state, run.error, run.finished_at = RunState.FAILED, error, datetime.now(UTC)
                level.append(run.id)
        frontier = level
        failed += len(level)
    return failed


def settle_orphans(t: Tables, limit: int) -> list[int]:
    """Waiting runs whose upstreams have all finished (a deleted one is not waited for):
    released, or failed with their downstream."""
    ids = [
        r.id
        for r in _waiting(t)
        if all(u not in t.runs or t.runs[u].state.finished for u in r.after)
    ][:limit]
    released = release(t, ids)
    for run_id in sorted(set(ids) - set(released)):
        run = t.runs[run_id]
        state, error = start_state({u: t.runs[u].state for u in run.after if u in t.runs})
        if state is RunState.FAILED and run.state is RunState.WAITING:
            run.state, run.error, run.finished_at = state, error, datetime.now(UTC)
            fail_downstream(t, run_id, RunState.FAILED)
    return released


def waiting_for(t: Tables, run: RunRow) -> tuple[list[int], list[int]]:
    """(its upstreams, those not finished; a deleted one counts as not finished)."""
    unfinished = [u for u in run.after if u not in t.runs or not t.runs[u].state.finished]
    return list(run.after), unfinished


def edges(t: Tables, run_id: int, upstream: bool) -> dict[int, list[int]]:
    """``deps.edges``: the run's graph on one side, run -> its upstreams (or dependents)."""
    found: dict[int, list[int]] = {}
    todo, seen = [run_id], set()
    while todo:
        near = todo.pop()
        if near in seen:
            continue
        seen.add(near)
        run = t.runs.get(near)
        far = (
            (list(run.after) if run is not None else [])
            if upstream
            else [r.id for r in t.runs.values() if near in r.after]
        )
        if far:
            found[near] = far
            todo.extend(far)
    return found


class MemoryRecovery:
    """``RecoveryStore``'s step for dependencies."""

    def __init__(self, tables: Tables) -> None:
        self.t = tables

    def settle_waiting(self, limit: int = 100) -> list[int]:
        with self.t.lock:
            return settle_orphans(self.t, limit)

    def release_expired(self, limit: int = 1000, lease_ttl: float = 8.0) -> list[Redispatch]:
        """Expired leases: a child's row back to pending and sent; a message's claim let go,
        the children it covered sent each on its own. Those of running runs, to re-send;
        ``limit`` rows and ``limit`` messages a call, as PostgreSQL's two statements."""
        with self.t.lock:
            now, resent = self.t.clock(), []
            for row in list(self.t.children.values()):
                lease = row.lease_expires_at
                if len(resent) >= limit:
                    break
                if row.state is ChildState.RUNNING and lease is not None and lease < now:
                    row.state, row.owner, row.lease_expires_at = ChildState.PENDING, None, None
                    row.sent_at = now
                    run = self.t.runs[row.run_id]
                    if run.state is RunState.RUNNING:
                        resent.append(
                            Redispatch(
                                row.run_id,
                                row.index,
                                jsonb(row.spec),
                                run.template,
                                run.group_id or "",
                                run.queue,
                            )
                        )
            for m in messages.expired(self.t)[:limit]:
                resent.extend(messages.let_go(self.t, m))
            return resent
