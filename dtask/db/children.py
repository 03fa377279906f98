"""Children under a lease with a fence: claim, heartbeat, checkpoint, finish, fail, release.

A child owner's writes are single autocommitted statements on the lease engine, each
conditional on its fence: a stale owner matches no row and gets LeaseLost.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Row

from dtask.db.database import Database, sql
from dtask.domain.runs import ChildState, ClaimRefusal, RunState, refuse_claim
from dtask.exceptions import LeaseLost


@dataclass(frozen=True)
class Claim:
    """A child this worker now owns: write with ``fence`` or lose the write."""

    child_id: int
    fence: int
    attempt: int
    max_attempts: int
    spec: dict[str, Any]
    checkpoint: Any
    execution_cap: float | None = None  # the run's own cap (None: the template's)


@dataclass(frozen=True)
class Refusal:
    reason: ClaimRefusal
    error: str | None = None


@dataclass(frozen=True)
class ChildView:
    """One child as an operator sees it."""

    index: int
    state: ChildState
    attempt: int
    owner: str | None  # host:pid while leased
    checkpoint: Any


_VIEW = "SELECT index, state, attempt, owner, checkpoint FROM dtask_children"


@dataclass(frozen=True)
class ChildDetail:
    """One child as the API and the dashboard show it."""

    index: int
    state: ChildState
    spec: Any  # its range (the child function's keyword arguments)
    attempt: int
    max_attempts: int
    checkpoint: Any
    error: str | None
    worker: str | None  # host:pid while leased
    started_at: datetime | None
    finished_at: datetime | None
    traceback: str | None = None  # of its latest failed attempt (only where asked for)
    output: str | None = None  # the last lines that attempt printed (only where asked for)

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state.value,
            "spec": self.spec,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "checkpoint": self.checkpoint,
            "error": self.error,
            "worker": self.worker,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            **({"traceback": self.traceback} if self.traceback is not None else {}),
            **({"output": self.output} if self.output is not None else {}),
        }


# A claim: the fence moves, the lease is ours; of a child that is pending, or running with an
# expired lease, with an attempt left, in an active run.
_TAKE = (
    "state = 'running', fence = fence + 1, owner = :owner,"
    " lease_expires_at = now() + make_interval(secs => :ttl), updated_at = now()"
)
_TAKEABLE = (
    "attempt < max_attempts"
    " AND (state = 'pending' OR (state = 'running' AND lease_expires_at < now()))"
    " AND EXISTS (SELECT 1 FROM dtask_runs r WHERE r.id = :run"
    "   AND r.state IN ('splitting', 'running'))"
)
_TAKEN = (
    "id, fence, attempt, max_attempts, spec, checkpoint,"
    " (SELECT r.execution_cap FROM dtask_runs r WHERE r.id = :run) AS cap"
)


def unfinished(run: str) -> str:
    """SQL that is true when run ``run`` (an SQL expression) has a pending or running child.

    Each state is asked for its highest index: children finish about in index order, so
    either index that can answer (run, state, index), or (run, index) read backwards, stops at
    its first entry, and a sequential scan, which would have to sort the run's children, is
    never the cheaper plan. An EXISTS was planned from the statistics as a scan that stopped
    at the first match, reading past every child finished so far: once a message."""
    return " OR ".join(
        f"(SELECT u.index FROM dtask_children u WHERE u.run_id = {run} AND u.state = '{state}'"
        " ORDER BY u.index DESC LIMIT 1) IS NOT NULL"
        for state in ("pending", "running")
    )


# A child's success, under the caller's fence (``:cp`` its last checkpoint, ``:result`` its
# return value as JSON text)
FINISH = (
    "state = 'succeeded', finished_at = now(),"
    " checkpoint = coalesce(CAST(:cp AS jsonb), checkpoint), owner = NULL,"
    " lease_expires_at = NULL, error = NULL, traceback = NULL, output = NULL,"
    " result = CAST(:result AS jsonb)"
)


# A claimed child starts (its attempt counted, its lease from now), under the caller's fence
_START = (
    "attempt = attempt + 1, lease_expires_at = now() + make_interval(secs => :ttl),"
    " started_at = coalesce(started_at, now()), updated_at = now()"
)


@dataclass(frozen=True)
class Finished:
    """A claimed child's success, not yet written: its claim, last checkpoint and result (JSON
    text)."""

    claim: Claim
    checkpoint: Any | None
    result: str | None


def _claim(row: Row[Any]) -> Claim:
    return Claim(
        child_id=row.id,
        fence=row.fence,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        spec=row.spec,
        checkpoint=row.checkpoint,
        execution_cap=row.cap,
    )


class ChildStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def claim(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal:
        """Take the child (pending, or running with an expired lease): the fence moves.

        Every statement here is conditional on its own, so each commits by itself: no
        transaction round trips on the path every child takes. Durably: a claim lost in a
        crash would hand its fence out again."""
        with self.db.owner(durable=True) as conn:
            row = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {_TAKE}, attempt = attempt + 1,"
                    " started_at = coalesce(started_at, now())"
                    f" WHERE run_id = :run AND index = :index AND {_TAKEABLE}"
                    f" RETURNING {_TAKEN}"
                ),
                {"run": run_id, "index": index, "owner": owner, "ttl": lease_ttl},
            ).first()
            if row is not None:
                return _claim(row)
            current = conn.execute(
                sql(
                    "SELECT c.id, c.state, c.attempt, c.max_attempts, c.error,"
                    " coalesce(c.lease_expires_at > now(), false) AS leased,"
                    " r.state IN ('splitting', 'running') AS run_active"
                    " FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                    " WHERE c.run_id = :run AND c.index = :index"
                ),
                {"run": run_id, "index": index},
            ).first()
            if current is None:
                return Refusal(ClaimRefusal.GONE)
            reason = refuse_claim(
                ChildState(current.state),
                current.attempt,
                current.max_attempts,
                current.leased,
                current.run_active,
            )
            if reason is not ClaimRefusal.EXHAUSTED:
                return Refusal(reason, current.error)
            error = _exhausted(current.attempt, current.error)
            failed = conn.execute(
                sql(
                    "UPDATE dtask_children SET state = 'failed', error = :error, owner = NULL,"
                    " lease_expires_at = NULL, finished_at = now(), updated_at = now()"
                    " WHERE id = :id AND attempt >= max_attempts"
                    " AND (state = 'pending' OR (state = 'running' AND lease_expires_at < now()))"
                ),
                {"id": current.id, "error": error},
            )
            if failed.rowcount == 1:
                return Refusal(ClaimRefusal.FAILED, error)
            return Refusal(ClaimRefusal.BUSY)

    def claim_many(
        self, run_id: int, indexes: list[int], owner: str, lease_ttl: float
    ) -> dict[int, Claim]:
        """Take several children of a run at once (a message of them), those that can be
        taken: each one's fence moves, all in one durable commit. Their attempts are counted
        as each starts (``start``), so a worker that dies before reaching one spends none of
        its attempts; the others are claimed one by one, to learn why not."""
        with self.db.owner(durable=True) as conn:
            rows = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {_TAKE}"
                    f" WHERE run_id = :run AND index = ANY(:indexes) AND {_TAKEABLE}"
                    f" RETURNING index AS position, {_TAKEN}"
                ),
                {"run": run_id, "indexes": indexes, "owner": owner, "ttl": lease_ttl},
            ).all()
        return {r.position: _claim(r) for r in rows}

    def start(self, claim: Claim, lease_ttl: float) -> Claim | None:
        """A child taken by ``claim_many`` starts: its attempt is counted and its lease runs
        from now, under its fence. None when the fence has moved or no attempt is left (then
        claim it the usual way, which says why)."""
        with self.db.owner(durable=False) as conn:
            row = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {_START}"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                    " AND attempt < max_attempts RETURNING attempt"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": lease_ttl},
            ).first()
        return None if row is None else replace(claim, attempt=row.attempt)

    def finish_and_start(
        self, done: Finished, claim: Claim, lease_ttl: float
    ) -> tuple[bool, Claim | None]:
        """``finish`` of ``done`` and ``start`` of ``claim`` (the next child of its message)
        in one statement, each under its own fence: whether ``done``'s success was written,
        and the started claim (None as for ``start``)."""
        with self.db.owner(durable=False) as conn:
            row = conn.execute(
                sql(
                    f"WITH done AS (UPDATE dtask_children SET {FINISH}, updated_at = now()"
                    "   WHERE id = :done_id AND fence = :done_fence AND state = 'running'"
                    "   RETURNING 1),"
                    f" began AS (UPDATE dtask_children SET {_START}"
                    "   WHERE id = :id AND fence = :fence AND state = 'running'"
                    "   AND attempt < max_attempts RETURNING attempt)"
                    " SELECT EXISTS (SELECT 1 FROM done) AS finished,"
                    " (SELECT attempt FROM began) AS attempt"
                ),
                {
                    "done_id": done.claim.child_id,
                    "done_fence": done.claim.fence,
                    "cp": json_or_none(done.checkpoint),
                    "result": done.result,
                    "id": claim.child_id,
                    "fence": claim.fence,
                    "ttl": lease_ttl,
                },
            ).one()
        started = None if row.attempt is None else replace(claim, attempt=row.attempt)
        return bool(row.finished), started

    def unclaim(self, claim: Claim) -> None:
        """Hand back a child taken by ``claim_many`` that never started (a drain)."""
        self._fenced_update(
            claim, "state = 'pending', owner = NULL, lease_expires_at = NULL, sent_at = now()"
        )

    def _fenced_update(
        self, claim: Claim, assignments: str, durable: bool = False, **params: Any
    ) -> None:
        """Write to a child we own: only while its fence is ours and it is running.
        A stale owner matches no row and gets LeaseLost."""
        with self.db.owner(durable) as conn:
            result = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {assignments}, updated_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                ),
                {"id": claim.child_id, "fence": claim.fence, **params},
            )
            if result.rowcount != 1:
                raise LeaseLost(lease_lost(claim))

    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float) -> None:
        """Commit the child's checkpoint (and renew its lease), or raise LeaseLost."""
        self._fenced_update(
            claim,
            "checkpoint = CAST(:cp AS jsonb),"
            " lease_expires_at = now() + make_interval(secs => :ttl)",
            durable=True,  # a resumed child starts from here: it must survive a crash
            cp=json.dumps(state),
            ttl=lease_ttl,
        )

    def finish(self, claim: Claim, final_checkpoint: Any | None, result: str | None = None) -> None:
        """running -> succeeded under our fence, with the function's return value (JSON text,
        checked by the caller), or raise LeaseLost."""
        self._fenced_update(claim, FINISH, cp=json_or_none(final_checkpoint), result=result)

    def note_time(self, run_id: int, seconds: float) -> None:
        """Fold a child's measured time (claim to finish, in its pool process) into the run's
        moving average: what the dispatcher sizes its messages by. Once per message."""
        with self.db.owner(durable=False) as conn:
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET child_seconds = CASE WHEN child_seconds IS NULL"
                    " THEN :s ELSE 0.7 * child_seconds + 0.3 * :s END WHERE id = :r"
                ),
                {"r": run_id, "s": seconds},
            )

    def any_unfinished(self, run_id: int) -> bool:
        """Whether a child of the run is still pending or running. Asked after a child's own
        final write committed, so of two last children finishing at once the later asker sees
        both finished."""
        with self.db.owner(durable=False) as conn:
            return bool(conn.execute(sql(f"SELECT {unfinished(':r')}"), {"r": run_id}).scalar())

    def fail_attempt(
        self, claim: Claim, error: str, traceback: str | None = None, output: str | None = None
    ) -> ChildState:
        """Record a failed attempt (its error line, traceback and last printed lines): back to
        pending for a retry, or failed when none are left."""
        with self.db.owner(durable=False) as conn:
            row = conn.execute(
                sql(
                    "UPDATE dtask_children SET"
                    " state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,"
                    " error = CASE WHEN attempt >= max_attempts"
                    "   THEN 'gave up after ' || attempt || ' attempt(s): ' || :error"
                    "   ELSE :error END,"
                    " finished_at = CASE WHEN attempt >= max_attempts THEN now() END,"
                    " traceback = :traceback, output = :output,"
                    " owner = NULL, lease_expires_at = NULL, updated_at = now(), sent_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                    " RETURNING state"
                ),
                {
                    "id": claim.child_id,
                    "fence": claim.fence,
                    "error": error,
                    "traceback": traceback,
                    "output": output,
                },
            ).first()
        if row is None:
            raise LeaseLost(lease_lost(claim))
        return ChildState(row.state)

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None:
        """Heartbeat: extend our lease; return the run's state (a cancel shows up here), or
        None when the fence has moved (we lost the child)."""
        with self.db.owner(durable=False) as conn:
            row = conn.execute(
                sql(
                    "UPDATE dtask_children c"
                    " SET lease_expires_at = now() + make_interval(secs => :ttl)"
                    " FROM dtask_runs r WHERE c.id = :id AND c.fence = :fence"
                    " AND c.state = 'running' AND r.id = c.run_id RETURNING r.state"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": lease_ttl},
            ).first()
            return None if row is None else RunState(row.state)

    def release(self, claim: Claim, checkpoint: Any | None) -> None:
        """Hand the child back (stopped at a checkpoint): pending again, this attempt not
        counted, resumable from ``checkpoint``."""
        self._fenced_update(
            claim,
            "state = 'pending', attempt = attempt - 1,"
            " checkpoint = coalesce(CAST(:cp AS jsonb), checkpoint), owner = NULL,"
            " lease_expires_at = NULL, sent_at = now()",  # its hand-over message goes now
            cp=json_or_none(checkpoint),
        )

    def revoke(self, run_id: int, index: int, error: str) -> bool:
        """Fail an unfinished child whatever its fence (someone revoked its task): its owner's
        next fenced write matches no row. True when it was unfinished."""
        with self.db.owner(durable=True) as conn:
            result = conn.execute(
                sql(
                    "UPDATE dtask_children SET state = 'failed', error = :error, owner = NULL,"
                    " lease_expires_at = NULL, finished_at = now(), updated_at = now()"
                    " WHERE run_id = :run AND index = :index AND state IN ('pending', 'running')"
                ),
                {"run": run_id, "index": index, "error": error},
            )
            return result.rowcount == 1

    def view(self, run_id: int, index: int) -> ChildView | None:
        with self.db.tx() as conn:
            row = conn.execute(
                sql(f"{_VIEW} WHERE run_id = :run AND index = :index"),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else _view(row)

    def first_checkpointed_running(self, run_id: int) -> ChildView | None:
        """The running child of the run with the lowest index that has committed progress."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    f"{_VIEW} WHERE run_id = :run AND state = 'running'"
                    " AND checkpoint IS NOT NULL ORDER BY index LIMIT 1"
                ),
                {"run": run_id},
            ).first()
        return None if row is None else _view(row)

    def page(
        self, run_id: int, state: ChildState | None, limit: int, after: int | None
    ) -> list[ChildDetail]:
        """The run's children in index order (only those in ``state``), after index ``after``."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT index, state, spec, attempt, max_attempts, checkpoint, error, owner,"
                    " started_at, finished_at FROM dtask_children WHERE run_id = :run"
                    " AND (CAST(:state AS varchar) IS NULL OR state = :state)"
                    " AND index > :after ORDER BY index LIMIT :limit"
                ),
                {"run": run_id, "state": state and state.value, "after": -1 if after is None
                 else after, "limit": limit},
            ).all()  # fmt: skip
        return [_detail(r) for r in rows]

    def detail(self, run_id: int, index: int) -> ChildDetail | None:
        """One child, with its latest failed attempt's traceback."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "SELECT index, state, spec, attempt, max_attempts, checkpoint, error, owner,"
                    " started_at, finished_at, traceback, output FROM dtask_children"
                    " WHERE run_id = :run AND index = :index"
                ),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else _detail(row, row.traceback, row.output)

    def grid(self, run_id: int) -> list[tuple[str, int]]:
        """The run's children in index order as runs of one state: [(state, how many), ...];
        a pending child not yet sent to the broker is ``waiting``. One letter per child
        crosses the wire (about 0.1 s for 100,000 children)."""
        with self.db.tx() as conn:
            letters = conn.execute(
                sql(
                    "SELECT string_agg(CASE WHEN state = 'pending' AND sent_at IS NULL"
                    "   THEN 'w' ELSE left(state, 1) END, '' ORDER BY index)"
                    " FROM dtask_children WHERE run_id = :run"
                ),
                {"run": run_id},
            ).scalar()
        return [(_GRID_STATES[k], sum(1 for _ in g)) for k, g in itertools.groupby(letters or "")]

    def error(self, run_id: int, index: int) -> str | None:
        with self.db.tx() as conn:
            row = conn.execute(
                sql("SELECT error FROM dtask_children WHERE run_id = :run AND index = :index"),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else row.error


_GRID_STATES = {"w": "waiting", **{s.value[0]: s.value for s in ChildState}}


def _detail(r: Row[Any], traceback: str | None = None, output: str | None = None) -> ChildDetail:
    return ChildDetail(
        r._mapping["index"], ChildState(r.state), r.spec, r.attempt, r.max_attempts,
        r.checkpoint, r.error, r.owner, r.started_at, r.finished_at, traceback, output,
    )  # fmt: skip


def _view(row: Row[Any]) -> ChildView:
    return ChildView(
        index=int(row._mapping["index"]),
        state=ChildState(row.state),
        attempt=int(row.attempt),
        owner=row.owner,
        checkpoint=row.checkpoint,
    )


def json_or_none(value: Any | None) -> str | None:
    return None if value is None else json.dumps(value)


def _exhausted(attempts: int, last_error: str | None) -> str:
    reason = last_error or "its worker process died while running it"
    if reason.startswith("gave up after"):
        return reason
    return f"gave up after {attempts} attempt(s): {reason}"


def lease_lost(claim: Claim) -> str:
    return (
        f"child {claim.child_id} was taken over by another worker (fence {claim.fence} is stale);"
        " this worker stops working on it"
    )
