"""A run of one child that nothing competes with, run by its master's task (the worker's
``InMaster``): its child is taken in the split's transaction, and finished with its run in one.
What that saves over a child message is docs/benchmarks.md's "many small runs"."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sqlalchemy import Connection

from dtask.db import concurrency, deps
from dtask.db.children import (
    BATCH_FINISH,
    BATCH_MATCH,
    BATCH_VALUES,
    FINISH,
    Claim,
    Finished,
    batch_values,
    json_or_none,
    lease_lost,
)
from dtask.db.database import RUN_LOCKS, Database, sql
from dtask.db.workers import LiveSlots, live_on
from dtask.domain.runs import RunState
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.exceptions import DtaskError, LeaseLost

NEXT_GROUP = "dispatches = dispatches + 1, group_id = 'dtask-' || id || '-' || (dispatches + 1)"
"""A run's next chord: its group id names the run and the dispatch (the callback's key)."""

SPLIT = (
    "state = :state, child_total = :total, unsent = :unsent, chord_size = :total,"
    f" {NEXT_GROUP}, started_at = coalesce(started_at, now()), updated_at = now()"
)
"""A pending run split into ``:total`` children, ``:unsent`` of them left to the dispatcher."""


@dataclass
class Inline:
    """A master's offer to run its run's child itself, under ``owner``'s lease; ``taken`` gets
    the child's index and claim when the split took it, ``template`` the run's template."""

    owner: str
    lease_ttl: float
    taken: list[tuple[int, Claim]] = field(default_factory=list)
    template: str = ""


_AT_ONCE = (
    "coalesce(r.queue, :q) = :q AND NOT EXISTS (SELECT FROM dtask_clients c"
    "   WHERE c.name = r.client AND c.max_running IS NOT NULL)"
    " AND NOT EXISTS (SELECT FROM dtask_runs o"
    "   WHERE o.unsent > 0 AND o.state = 'running' AND coalesce(o.queue, :q) = :q"
    "   AND o.priority > r.priority)"
)
"""A run ``r`` whose one child the dispatcher would send at once (``take``'s conditions)."""


def take(conn: Connection, run_id: int, max_attempts: int, spec: Any, offer: Inline) -> bool:
    """pending -> running for a run of one child that would leave at once, its child inserted
    as taken by ``offer.owner`` (its fence moved, its attempt counted when it starts, as
    ``ChildStore.claim_many`` leaves a child of a message): the dispatcher has nothing to weigh
    it against. Not when it goes to a tier's queue (other workers consume it), its client caps
    its children running (the dispatcher counts them) or a run of higher priority waits in the
    default queue for the window; then it is split as any other. Among equals the masters'
    order decides, as the dispatcher's lane for a small run's first child would."""
    run = conn.execute(
        sql(
            f"UPDATE dtask_runs r SET {SPLIT}"
            f" WHERE id = :id AND state = 'pending' AND {_AT_ONCE} RETURNING execution_cap"
        ),
        {
            "id": run_id,
            "q": DEFAULT_QUEUE,
            "state": RunState.RUNNING.value,
            "total": 1,
            "unsent": 0,
        },
    ).first()
    if run is None:
        return False
    text = spec if isinstance(spec, str) else json.dumps(spec)
    child = conn.execute(
        sql(
            "INSERT INTO dtask_children (run_id, index, spec, max_attempts, state, fence,"
            " owner, lease_expires_at)"
            " VALUES (:run, 0, CAST(:spec AS jsonb), :max, 'running', 1, :owner,"
            " now() + make_interval(secs => :ttl))"
            " RETURNING id, fence, attempt, max_attempts, spec"
        ),
        {
            "run": run_id,
            "spec": text,
            "max": max_attempts,
            "owner": offer.owner,
            "ttl": offer.lease_ttl,
        },
    ).one()
    claim = Claim(
        child.id,
        child.fence,
        child.attempt,
        child.max_attempts,
        child.spec,
        None,
        run.execution_cap,
    )
    offer.taken.append((0, claim))
    return True


def finish(
    conn: Connection,
    run_id: int,
    done: Finished,
    chained: list[int] | None = None,
) -> list[int] | None:
    """The child succeeded under our fence (LeaseLost if it is no longer ours), and with it
    the run: the dependents that released (their masters are the caller's to send), or None
    where the run did not move (it was cancelled meanwhile). The run goes to ``chained`` when
    Celery chains wait for it (the caller sends them)."""
    child = conn.execute(
        sql(
            f"UPDATE dtask_children SET {FINISH}, updated_at = now()"
            " WHERE id = :id AND fence = :fence AND state = 'running'"
        ),
        {
            "id": done.claim.child_id,
            "fence": done.claim.fence,
            "cp": json_or_none(done.checkpoint),
            "result": done.result,
            "output": done.output,
        },
    )
    if child.rowcount != 1:
        raise LeaseLost(lease_lost(done.claim))
    run = conn.execute(
        sql(
            "UPDATE dtask_runs SET state = 'succeeded', error = NULL, finished_at = now(),"
            " result = NULL, updated_at = now() WHERE id = :id AND state = 'running'"
            " AND NOT EXISTS (SELECT FROM dtask_children WHERE run_id = :id"
            "   AND state <> 'succeeded')"
            " RETURNING chains IS NOT NULL AS chained, client, concurrency_key"
        ),
        {"id": run_id},
    ).first()
    if run is None:
        return None
    if run.chained and chained is not None:
        chained.append(run_id)
    return deps.settle(conn, run_id, RunState.SUCCEEDED, concurrency.key_of(run))


# A plan for one run: (its template, variables, live slots) -> its children's specs, or None
# where it is not to be taken with others
Plan = Callable[[str, dict[str, Any], LiveSlots], Sequence[str | Mapping[str, Any]] | None]

_SIBLINGS = (
    "SELECT s.id FROM dtask_runs s JOIN dtask_runs f ON f.id = :first"
    " WHERE s.state = 'pending' AND s.template = f.template AND s.priority = f.priority"
    " AND s.id <> f.id AND coalesce(s.start_after, now()) <= now()"
    " ORDER BY s.id LIMIT :n"
)
"""Up to ``:n`` other pending runs, due, of the template and priority of run ``:first``."""

# a master finds nothing to do for a run in these states (a duplicate, or taken as a sibling)
_SPLIT_ALREADY = ("running", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Taken:
    """A run taken with others by ``InlineStore.split_many``: its child's claim."""

    run_id: int
    template: str
    claim: Claim


@dataclass(frozen=True)
class Ended:
    """What ``InlineStore.finish_many`` wrote: the runs that succeeded with their child, those
    Celery chains wait for, and the dependents released (their masters are the caller's)."""

    succeeded: list[int]
    chained: list[int]
    released: list[int]


class InlineStore:
    """Several one-child runs of one template (a ``dtask.masters`` message's) taken and
    finished together: what ``take`` and ``finish`` do for one, in two statements for all at
    the split, and three at the finish."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def split_many(
        self, run_ids: list[int], plan: Plan, owner: str, lease_ttl: float, siblings: int = 0
    ) -> tuple[list[Taken], list[int]]:
        """pending -> running for those of ``run_ids`` whose plan is one child (``plan``
        returns None for a run not to be taken so: its template unknown here, or with a
        reduce), as ``take`` would move each, their children taken by ``owner``; with
        ``siblings``, up to that many more pending runs of ``run_ids[0]``'s template and
        priority, oldest first, that are due (their masters, when they come, find them
        taken). Returns each run taken, in id order, and those of
        ``run_ids`` for their masters' usual path: their lock held by another master, not
        due, waiting, planned otherwise, or not to be taken at once, untouched (a run
        already split or finished is in neither). A plan's error leaves its run too: that
        path fails it with the error."""
        templates: dict[int, str] = {}
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    # the runs first, then their locks: a lock in the same WHERE could be
                    # tried on rows a sequential scan reads before the ids filter them out
                    "WITH r AS MATERIALIZED (SELECT id, template, variables, max_attempts,"
                    " queue, state, coalesce(start_after, now()) <= now() AS due"
                    f" FROM dtask_runs WHERE id = ANY(:ids) OR id IN ({_SIBLINGS}))"
                    " SELECT * FROM r"
                    " WHERE pg_try_advisory_xact_lock(:ns, CAST(id & 2147483647 AS int))"
                ),
                {"ids": run_ids, "first": run_ids[0], "n": siblings, "ns": RUN_LOCKS},
            ).all()
            one: dict[int, tuple[str, int]] = {}
            for row in rows:
                if row.state != RunState.PENDING.value or not row.due:
                    continue
                slots = LiveSlots(partial(live_on, conn), row.queue, row.template)
                try:
                    specs = plan(row.template, row.variables, slots)
                except DtaskError:
                    continue
                if specs is not None and len(specs) == 1 and slots.seen is None:
                    spec = specs[0]
                    text = spec if isinstance(spec, str) else json.dumps(spec)
                    one[row.id] = (text, row.max_attempts)
                    templates[row.id] = row.template
            claims = _take_many(conn, one, owner, lease_ttl) if one else []
        taken = [Taken(run_id, templates[run_id], claim) for run_id, claim in claims]
        moved = {t.run_id for t in taken} | {r.id for r in rows if r.state in _SPLIT_ALREADY}
        return taken, [i for i in run_ids if i not in moved]

    def finish_many(self, done: Sequence[tuple[int, Finished]]) -> Ended:
        """Each child of ``done`` (run id, success) succeeded under its fence (counting its
        attempt if not yet counted), and its run with it, in one transaction under the runs'
        locks: what ``finish`` does for one. A child whose fence moved is not written (not in
        ``succeeded``); a run cancelled meanwhile does not move."""
        if not done:
            return Ended([], [], [])
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "SELECT count(pg_advisory_xact_lock(:ns, k)) FROM (SELECT DISTINCT k FROM"
                    " unnest(CAST(:keys AS int[])) k ORDER BY k) s"
                ),
                {"ns": RUN_LOCKS, "keys": [run_id & 0x7FFFFFFF for run_id, _ in done]},
            )
            rows = conn.execute(
                sql(
                    f"WITH {BATCH_VALUES},"
                    f" child AS (UPDATE dtask_children c SET {BATCH_FINISH}, updated_at = now()"
                    f"   FROM v WHERE {BATCH_MATCH} RETURNING c.run_id)"
                    " UPDATE dtask_runs SET state = 'succeeded', error = NULL, finished_at = now(),"
                    " result = NULL, updated_at = now() WHERE id IN (SELECT run_id FROM child)"
                    " AND state = 'running' AND child_total = 1"
                    " RETURNING id, chains IS NOT NULL AS chained, client, concurrency_key"
                ),
                batch_values([d for _, d in done]),
            ).all()
            succeeded = sorted(int(r.id) for r in rows)
            keys = [key for key in map(concurrency.key_of, rows) if key is not None]
            released = deps.release(conn, deps.waiting_dependents(conn, succeeded), keys)
        return Ended(succeeded, sorted(int(r.id) for r in rows if r.chained), released)


def _take_many(
    conn: Connection, one: dict[int, tuple[str, int]], owner: str, lease_ttl: float
) -> list[tuple[int, Claim]]:
    """``take`` of each run of ``one`` (run id: its child's spec as JSON text, its max
    attempts) in one statement. A child taken for the first time counts its attempt with its
    end, as ``ChildStore.claim_many``'s do."""
    rows = conn.execute(
        sql(
            f"WITH taken AS (UPDATE dtask_runs r SET {SPLIT}"
            f"   WHERE id = ANY(:runs) AND state = 'pending' AND {_AT_ONCE}"
            "   RETURNING id, execution_cap),"
            " child AS (INSERT INTO dtask_children"
            "   (run_id, index, spec, max_attempts, state, fence, owner, lease_expires_at,"
            "   started_at) SELECT v.run, 0, CAST(v.spec AS jsonb), v.max, 'running', 1, :owner,"
            "   now() + make_interval(secs => :ttl), now() FROM unnest(CAST(:runs AS bigint[]),"
            "   CAST(:specs AS text[]), CAST(:maxes AS int[])) AS v(run, spec, max)"
            "   JOIN taken ON taken.id = v.run"
            "   RETURNING id, run_id, fence, attempt, max_attempts, spec)"
            " SELECT child.*, taken.execution_cap FROM child JOIN taken"
            " ON taken.id = child.run_id ORDER BY child.run_id"
        ),
        {
            "runs": list(one),
            "specs": [spec for spec, _ in one.values()],
            "maxes": [most for _, most in one.values()],
            "q": DEFAULT_QUEUE,
            "state": RunState.RUNNING.value,
            "total": 1,
            "unsent": 0,
            "owner": owner,
            "ttl": lease_ttl,
        },
    ).all()
    claims = [
        Claim(r.id, r.fence, r.attempt + 1, r.max_attempts, r.spec, None, r.execution_cap, False)
        for r in rows
    ]
    return [(r.run_id, claim) for r, claim in zip(rows, claims, strict=True)]
