"""A run of one child that nothing competes with, run by its master's task (the worker's
``InMaster``): its child is taken in the split's transaction, and finished with its run in one.
What that saves over a child message is docs/benchmarks.md's "many small runs"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from dtask.db import deps
from dtask.db.children import FINISH, Claim, Finished, json_or_none, lease_lost
from dtask.db.database import sql
from dtask.domain.runs import RunState
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.exceptions import LeaseLost

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
            " WHERE id = :id AND state = 'pending' AND coalesce(queue, :q) = :q"
            " AND NOT EXISTS (SELECT FROM dtask_clients c"
            "   WHERE c.name = r.client AND c.max_running IS NOT NULL)"
            " AND NOT EXISTS (SELECT FROM dtask_runs o"
            "   WHERE o.unsent > 0 AND o.state = 'running' AND coalesce(o.queue, :q) = :q"
            "   AND o.priority > r.priority)"
            " RETURNING execution_cap"
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
            " RETURNING chains IS NOT NULL AS chained"
        ),
        {"id": run_id},
    ).first()
    if run is None:
        return None
    if run.chained and chained is not None:
        chained.append(run_id)
    return deps.settle(conn, run_id, RunState.SUCCEEDED)
