"""Children under a lease with a fence: claim, heartbeat, checkpoint, finish, fail, release.

A child owner's writes are single autocommitted statements on the lease engine, each
conditional on its fence: a stale owner matches no row and gets LeaseLost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Row

from dtask.db import message_claims, steals
from dtask.db.child_reads import ChildReads
from dtask.db.database import ASYNC_COMMIT, sql
from dtask.db.queued import SEEN
from dtask.db.redispatch import Redispatch, redispatch_from_row
from dtask.db.steals import Gift
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
    # False: ``attempt`` (this one) is counted in PostgreSQL only by the child's finish or
    # failure, or a start that writes anyway (a child taken for the first time with its
    # message's others, ``claim_many``)
    counted: bool = True
    # the id of the message whose claim covers this child (db/message_claims.py): ``fence`` is
    # the message's; None: the child's own row is claimed
    message: int | None = None

    @property
    def uncounted(self) -> int:
        """What a write that ends this attempt adds to ``attempt``."""
        return 0 if self.counted else 1


@dataclass(frozen=True)
class Refusal:
    reason: ClaimRefusal
    error: str | None = None


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
    # not a child that a message's claim covers (a copy of a message held by another worker)
    f" AND NOT ({message_claims.held('dtask_children')})"
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


# an attempt ends: the worker that ran it stays named (``owner`` is its lease, cleared now)
KEEP_WORKER = "worker = coalesce(owner, worker)"


def finish(cp: str = ":cp", result: str = ":result", output: str = ":output") -> str:
    """A child's success, under the caller's fence (``cp`` its last checkpoint, ``result`` its
    return value, both JSON text; ``output`` the last lines it printed)."""
    return (
        "state = 'succeeded', finished_at = now(),"
        f" checkpoint = coalesce(CAST({cp} AS jsonb), checkpoint), {KEEP_WORKER}, owner = NULL,"
        " lease_expires_at = NULL, error = NULL, traceback = NULL,"
        f" output = CAST({output} AS text), result = CAST({result} AS jsonb)"
    )


FINISH = finish()

# Several children's successes in one statement: ``v`` holds them (``batch_values``), each
# matched to its child by id and fence while the child runs. The state is matched as a column
# of ``v``, not as the constant 'running': from a constant PostgreSQL estimated the running
# children from statistics taken at the split (none), scanned them first and read the whole
# of ``v`` once for each, 80 ms for a message of 400 children (bench/notes.md, item 11).
BATCH_VALUES = (
    "v AS (SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:fences AS bigint[]),"
    " CAST(:cps AS text[]), CAST(:results AS text[]), CAST(:counts AS int[]),"
    " CAST(:outputs AS text[]), CAST(:states AS text[]))"
    " AS v(id, fence, cp, result, counts, output, state))"
)
BATCH_FINISH = f"{finish('v.cp', 'v.result', 'v.output')}, attempt = c.attempt + v.counts"


def _under_message(assignments: str) -> str:
    """``assignments`` to a child its message's claim covers: its worker is the message's
    owner (``message_claims``'s ``m.holder``), not its own row's."""
    return assignments.replace(KEEP_WORKER, "worker = m.holder")


_COVERED_FINISH = _under_message(BATCH_FINISH)
BATCH_MATCH = (
    "c.id = ANY(CAST(:ids AS bigint[])) AND c.id = v.id AND c.fence = v.fence AND c.state = v.state"
)


def batch_values(done: Sequence[Finished]) -> dict[str, list[Any]]:
    """``BATCH_VALUES``'s parameters for ``done``."""
    return {
        "ids": [d.claim.child_id for d in done],
        "fences": [d.claim.fence for d in done],
        "cps": [json_or_none(d.checkpoint) for d in done],
        "results": [d.result for d in done],
        "counts": [d.claim.uncounted for d in done],
        "outputs": [d.output for d in done],
        "states": [ChildState.RUNNING.value] * len(done),
    }


# A claimed child starts (its attempt counted, its lease from now), under the caller's fence
_START = (
    "attempt = attempt + 1, lease_expires_at = now() + make_interval(secs => :ttl),"
    " started_at = coalesce(started_at, now()), updated_at = now()"
)


# A failed attempt, under the caller's fence: back to pending and sent (its retry goes now), or
# failed when it was ``:final`` (a permanent error) or its last
_ENDS = "(:final OR attempt + :counts >= max_attempts)"
_FAIL = (
    "attempt = attempt + :counts,"
    f" state = CASE WHEN {_ENDS} THEN 'failed' ELSE 'pending' END,"
    " error = CASE WHEN :final THEN 'not retried (a permanent error) at attempt '"
    "   || (attempt + :counts) || ': ' || :error"
    "   WHEN attempt + :counts >= max_attempts"
    "   THEN 'gave up after ' || (attempt + :counts) || ' attempt(s): ' || :error"
    "   ELSE :error END,"
    f" finished_at = CASE WHEN {_ENDS} THEN now() END,"
    " started_at = coalesce(started_at, now()),"
    f" traceback = :traceback, output = :output, {KEEP_WORKER},"
    " owner = NULL, lease_expires_at = NULL, sent_at = now()"
)


@dataclass(frozen=True)
class Finished:
    """A claimed child's success, not yet written: its claim, last checkpoint, result (JSON
    text) and the last lines it printed (worker/output.py)."""

    claim: Claim
    checkpoint: Any | None
    result: str | None
    output: str | None = None


def _covered(row: Row[Any]) -> Claim:
    """A child its message's claim covers: the message's fence, the attempt counted by the
    write that ends it."""
    return Claim(
        child_id=row.id,
        fence=row.fence,
        attempt=row.attempt + 1,
        max_attempts=row.max_attempts,
        spec=row.spec,
        checkpoint=row.checkpoint,
        execution_cap=row.cap,
        counted=False,
        message=row.message,
    )


def _claim(row: Row[Any], first_with_others: bool = False) -> Claim:
    """``first_with_others``: taken by ``claim_many`` for the first time (fence 1), its
    attempt counted only by the write that ends it."""
    uncounted = first_with_others and row.fence == 1
    return Claim(
        child_id=row.id,
        fence=row.fence,
        attempt=row.attempt + 1 if uncounted else row.attempt,
        max_attempts=row.max_attempts,
        spec=row.spec,
        checkpoint=row.checkpoint,
        execution_cap=row.cap,
        counted=not uncounted,
    )


class ChildStore(ChildReads):
    """A child's lifecycle under its lease and fence (and, inherited, how operators read
    children)."""

    def claim(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal:
        """Take the child (pending, or running with an expired lease): the fence moves.

        Every statement here is conditional on its own, so each commits by itself: no
        transaction round trips on the path every child takes. Durably: a claim lost in a
        crash would hand its fence out again."""
        with self.db.owner() as conn:
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
        taken: each one's fence moves, all in one durable commit; the others are claimed one
        by one, to learn why not. No attempt is counted here, so a worker that dies before
        reaching a child spends none of its attempts: a child taken before counts its
        attempt as it starts (``start``); one taken for the first time (fence 1) only with
        its finish or failure (``write_batch``, ``fail_attempt``), so a worker killed while
        it runs spends none, and the next take, not a first, counts as it starts. The
        dispatcher's row of the message is marked taken (``queued.SEEN``).

        A message the dispatcher sent, taken for the first time, is claimed as one row
        (``message_claims``): its children are not written until each one ends."""
        if not indexes:
            return {}
        with self.db.owner() as conn:
            taken = message_claims.claim(conn, run_id, indexes, owner, lease_ttl)
            if not taken and len(indexes) > 1:  # its pass may not have committed yet
                message_claims.after_pass(conn)
                taken = message_claims.claim(conn, run_id, indexes, owner, lease_ttl)
            if taken:
                return {r.position: _covered(r) for r in taken if r.id is not None}
            rows = conn.execute(
                sql(
                    f"WITH seen AS ({SEEN})"
                    f" UPDATE dtask_children SET {_TAKE}, started_at = coalesce(started_at, now())"
                    # the bounds (and the states, where its plan is the (run, state,
                    # index) index) keep the scan to the message's children whatever the
                    # statistics say: with a run's rows not analyzed yet, PostgreSQL read
                    # every child of the run for each message (30 ms for 400 of 20,000)
                    " WHERE run_id = :run AND state IN ('pending', 'running')"
                    " AND index BETWEEN :lo AND :hi"
                    f" AND index = ANY(:indexes) AND {_TAKEABLE}"
                    f" RETURNING index AS position, {_TAKEN}"
                ),
                {
                    "run": run_id,
                    "indexes": indexes,
                    "lo": min(indexes, default=-1),
                    "hi": max(indexes, default=-1),
                    "owner": owner,
                    "ttl": lease_ttl,
                },
            ).all()
        return {r.position: _claim(r, first_with_others=True) for r in rows}

    def start(self, claim: Claim, lease_ttl: float) -> Claim | None:
        """A child taken by ``claim_many`` starts: its attempt is counted and its lease runs
        from now, under its fence. None when the fence has moved or no attempt is left (then
        claim it the usual way, which says why). A child its message covers writes nothing
        of its own: its message's lease is renewed."""
        if claim.message is not None:
            return claim if self.renew_lease(claim, lease_ttl) is not None else None
        with self.db.owner() as conn:
            row = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {_START}"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                    f" AND attempt < max_attempts AND {ASYNC_COMMIT} RETURNING attempt"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": lease_ttl},
            ).first()
        return None if row is None else replace(claim, attempt=row.attempt, counted=True)

    def write_batch(
        self, done: list[Finished], claim: Claim | None, lease_ttl: float
    ) -> tuple[set[int], Claim | None]:
        """``finish`` of each of ``done`` (counting the attempt of those not counted yet) and
        ``start`` of ``claim`` (the next child of their message, if any) in one statement,
        each under its own fence: the ids of those of ``done`` written, and the started claim
        (None as for ``start``). Those a message covers are written under its fence, which
        renews its lease (``claim``, covered too, then starts without a write of its own)."""
        written, started = self._finish_covered(done, claim, lease_ttl)
        done = [d for d in done if d.claim.message is None]
        claim = claim if claim is not None and claim.message is None else None
        if not done and claim is None:
            return written, started
        with self.db.owner() as conn:
            row = conn.execute(
                sql(
                    f"WITH {BATCH_VALUES},"
                    f" done AS (UPDATE dtask_children c SET {BATCH_FINISH}, updated_at = now(),"
                    f"   started_at = coalesce(c.started_at, now()) FROM v WHERE {BATCH_MATCH}"
                    "   RETURNING c.id),"
                    f" began AS (UPDATE dtask_children SET {_START}"
                    "   WHERE id = :id AND fence = :fence AND state = 'running'"
                    "   AND attempt < max_attempts RETURNING attempt)"
                    " SELECT ARRAY(SELECT id FROM done) AS finished,"
                    f" (SELECT attempt FROM began) AS attempt WHERE {ASYNC_COMMIT}"
                ),
                {
                    **batch_values(done),
                    "id": None if claim is None else claim.child_id,
                    "fence": None if claim is None else claim.fence,
                    "ttl": lease_ttl,
                },
            ).one()
        written |= set(row.finished)
        if claim is None or row.attempt is None:
            return written, started
        return written, replace(claim, attempt=row.attempt, counted=True)

    def _finish_covered(
        self, done: list[Finished], claim: Claim | None, lease_ttl: float
    ) -> tuple[set[int], Claim | None]:
        """``write_batch``'s part under messages' claims: per message (one, in a message's
        path), its covered children's successes and, if ``claim`` is covered by it, whether
        that one starts."""
        written: set[int] = set()
        started: Claim | None = None
        messages = {d.claim.message for d in done} | {None if claim is None else claim.message}
        for message in sorted(m for m in messages if m is not None):
            mine = [d for d in done if d.claim.message == message]
            starts = claim if claim is not None and claim.message == message else None
            fenced = mine[0].claim if mine else starts
            assert fenced is not None  # the message is one of done's or claim's
            with self.db.owner() as conn:
                finished, held = message_claims.finish_many(
                    conn, message, fenced.fence, BATCH_VALUES, _COVERED_FINISH, lease_ttl,
                    batch_values(mine), None if starts is None else starts.child_id,
                )  # fmt: skip
            written |= finished
            if starts is not None and held:
                started = starts
        return written, started

    def unclaim(self, claim: Claim) -> None:
        """Hand back a child taken by ``claim_many`` that never started (a drain)."""
        self._fenced_update(
            claim, "state = 'pending', owner = NULL, lease_expires_at = NULL, sent_at = now()"
        )

    def _fenced_update(
        self,
        claim: Claim,
        assignments: str,
        durable: bool = False,
        ttl: float | None = None,
        **params: Any,
    ) -> Row[Any]:
        """Write to a child we own: only while its fence is ours and it is running.
        A stale owner matches no row and gets LeaseLost. ``ttl``: a covered child's write
        renews its message's lease."""
        commit = "" if durable else f" AND {ASYNC_COMMIT}"
        with self.db.owner() as conn:
            if claim.message is not None:
                row = message_claims.write(
                    conn, claim.message, claim.fence, claim.child_id,
                    _under_message(assignments),
                    ttl, durable, **params,
                )  # fmt: skip
                if row is None:
                    raise LeaseLost(lease_lost(claim))
                return row
            row = conn.execute(
                sql(
                    f"UPDATE dtask_children SET {assignments}, updated_at = now()"
                    f" WHERE id = :id AND fence = :fence AND state = 'running'{commit}"
                    " RETURNING give_away"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": ttl, **params},
            ).first()
            if row is None:
                raise LeaseLost(lease_lost(claim))
            return row

    def checkpoint(self, claim: Claim, state: Any, lease_ttl: float, ran: float = 0.0) -> bool:
        """Commit the child's checkpoint (and renew its lease), or raise LeaseLost. True when
        it is asked to give work away (docs/elastic.md). ``ran``: the seconds its attempt has
        run, for a child whose start was not written (its message's claim covers it): its
        rate, which decides whether it is worth cutting, counts from its start."""
        row = self._fenced_update(
            claim,
            "checkpoint = CAST(:cp AS jsonb),"
            " started_at = coalesce(started_at, now() - make_interval(secs => :ran)),"
            " lease_expires_at = now() + make_interval(secs => :ttl)",
            durable=True,  # a resumed child starts from here: it must survive a crash
            ttl=lease_ttl,
            cp=json.dumps(state),
            ran=ran,
        )
        return bool(row.give_away)

    def give_away(
        self, claim: Claim, run_id: int, keys: tuple[str, str], end: int, at: int, deferred: bool
    ) -> Gift | None:
        """``steals.give_away``: this child keeps ``[a, at - 1]``, a new one gets the rest."""
        child = (claim.child_id, claim.fence, claim.message)
        return steals.give_away(self.db, child, run_id, keys, end, at, deferred)

    def finish(
        self,
        claim: Claim,
        final_checkpoint: Any | None,
        result: str | None = None,
        output: str | None = None,
    ) -> None:
        """running -> succeeded under our fence, with the function's return value (JSON text,
        checked by the caller) and the last lines it printed, or raise LeaseLost."""
        self._fenced_update(
            claim,
            f"{FINISH}, attempt = attempt + :counts",
            cp=json_or_none(final_checkpoint),
            result=result,
            output=output,
            counts=claim.uncounted,
        )

    def note_time(self, run_id: int, seconds: float) -> bool:
        """Fold a child's measured time (claim to finish, in its pool process) into the run's
        moving average: what the dispatcher sizes its messages by. Once per message. True
        where it was the run's first and children of it wait unsent: their messages can be
        sized now."""
        with self.db.owner() as conn:
            first = conn.execute(
                sql(
                    "UPDATE dtask_runs r SET child_seconds = CASE WHEN r.child_seconds IS NULL"
                    " THEN :s ELSE 0.7 * r.child_seconds + 0.3 * :s END"
                    " FROM (SELECT child_seconds IS NULL AS unmeasured FROM dtask_runs"
                    " WHERE id = :r) before"
                    f" WHERE r.id = :r AND {ASYNC_COMMIT}"
                    " RETURNING before.unmeasured AND r.unsent > 0"
                ),
                {"r": run_id, "s": seconds},
            ).scalar()
        return bool(first)

    def any_unfinished(self, run_id: int) -> bool:
        """Whether a child of the run is still pending or running. Asked after a child's own
        final write committed, so of two last children finishing at once the later asker sees
        both finished."""
        with self.db.owner() as conn:
            return bool(conn.execute(sql(f"SELECT {unfinished(':r')}"), {"r": run_id}).scalar())

    def fail_attempt(
        self,
        claim: Claim,
        error: str,
        traceback: str | None = None,
        output: str | None = None,
        final: bool = False,
        skipped: int = 0,
    ) -> ChildState:
        """Record a failed attempt (its error line, traceback and last printed lines, kept
        with the attempt in ``dtask_child_logs`` too, ``skipped`` characters before them not
        kept): back to pending for a retry, or failed when none are left or it is ``final``
        (a permanent error)."""
        if claim.message is not None:
            return self._fail_covered(claim, error, traceback, output, final, skipped)
        with self.db.owner() as conn:
            row = conn.execute(
                sql(
                    f"WITH c AS (UPDATE dtask_children SET {_FAIL}, updated_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                    f" AND {ASYNC_COMMIT} RETURNING run_id, index, worker, state),"
                    " log AS (INSERT INTO dtask_child_logs"
                    " (run_id, index, attempt, worker, state, output, skipped, error)"
                    " SELECT run_id, index, :attempt, worker, 'failed', :output, :skipped, :error"
                    " FROM c ON CONFLICT (run_id, index, attempt) DO UPDATE SET"
                    " worker = excluded.worker, state = 'failed', output = excluded.output,"
                    " skipped = excluded.skipped, error = excluded.error, updated_at = now())"
                    " SELECT state FROM c"
                ),
                {
                    "id": claim.child_id,
                    "fence": claim.fence,
                    "counts": claim.uncounted,
                    "error": error,
                    "traceback": traceback,
                    "output": output,
                    "final": final,
                    "attempt": claim.attempt,
                    "skipped": skipped,
                },
            ).first()
        if row is None:
            raise LeaseLost(lease_lost(claim))
        return ChildState(row.state)

    def _fail_covered(
        self,
        claim: Claim,
        error: str,
        traceback: str | None,
        output: str | None,
        final: bool,
        skipped: int,
    ) -> ChildState:
        """``fail_attempt`` of a child its message covers: out of the message, under its fence."""
        row = self._fenced_update(
            claim,
            _FAIL,
            counts=claim.uncounted,
            error=error,
            traceback=traceback,
            output=output,
            final=final,
        )
        kept = (output, skipped)
        self.write_log(
            row.run_id, row._mapping["index"], claim.attempt, row.worker, kept, "failed", error
        )
        return ChildState(row.state)

    def close(self, claim: Claim) -> list[Redispatch]:
        """The end of the message whose claim covers ``claim``'s child: let go of it; the
        children it still covers (none when each one's end was written) go out again on
        their own: returned, to be sent."""
        if claim.message is None:
            return []
        with self.db.owner() as conn:
            rows = message_claims.close(conn, claim.message, claim.fence)
        return [redispatch_from_row(r) for r in rows if r.resend]

    def write_log(
        self,
        run_id: int,
        index: int,
        attempt: int,
        worker: str | None,
        kept: tuple[str | None, int],
        state: str = "running",
        error: str | None = None,
    ) -> None:
        """A running attempt's output so far (``kept``: the text, the characters before it
        not kept), written by its heartbeat when it printed since; or a failed one's."""
        with self.db.owner() as conn:
            conn.execute(
                sql(
                    "INSERT INTO dtask_child_logs"
                    " (run_id, index, attempt, worker, state, output, skipped, error)"
                    " VALUES (:run, :index, :attempt, :worker, :state, :output, :skipped, :error)"
                    " ON CONFLICT (run_id, index, attempt) DO UPDATE SET"
                    " worker = excluded.worker, state = excluded.state, output = excluded.output,"
                    " skipped = excluded.skipped, error = excluded.error, updated_at = now()"
                ),
                {
                    "run": run_id,
                    "index": index,
                    "attempt": attempt,
                    "worker": worker,
                    "output": kept[0],
                    "skipped": kept[1],
                    "state": state,
                    "error": error,
                },
            )

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None:
        """Heartbeat: extend our lease; return the run's state (a cancel shows up here), or
        None when the fence has moved (we lost the child)."""
        with self.db.owner() as conn:
            if claim.message is not None:
                state = message_claims.renew(
                    conn, claim.message, claim.fence, claim.child_id, lease_ttl
                )
                return None if state is None else RunState(state)
            row = conn.execute(
                sql(
                    "UPDATE dtask_children c"
                    " SET lease_expires_at = now() + make_interval(secs => :ttl)"
                    " FROM dtask_runs r WHERE c.id = :id AND c.fence = :fence"
                    " AND c.state = 'running' AND r.id = c.run_id"
                    f" AND {ASYNC_COMMIT} RETURNING r.state"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": lease_ttl},
            ).first()
            return None if row is None else RunState(row.state)

    def release(self, claim: Claim, checkpoint: Any | None) -> None:
        """Hand the child back (stopped at a checkpoint): pending again, this attempt not
        counted, resumable from ``checkpoint``."""
        self._fenced_update(
            claim,
            "state = 'pending', attempt = attempt - :counted,"
            f" checkpoint = coalesce(CAST(:cp AS jsonb), checkpoint), {KEEP_WORKER}, owner = NULL,"
            " lease_expires_at = NULL, sent_at = now()",  # its hand-over message goes now
            cp=json_or_none(checkpoint),
            counted=int(claim.counted),
        )

    def revoke(self, run_id: int, index: int, error: str) -> bool:
        """Fail an unfinished child whatever its fence (someone revoked its task): its owner's
        next fenced write matches no row. True when it was unfinished."""
        with self.db.owner() as conn:
            row = conn.execute(
                sql(
                    "WITH old AS (SELECT id, state = 'pending' AND sent_at IS NULL AS unsent"
                    "   FROM dtask_children WHERE run_id = :run AND index = :index"
                    "   AND state IN ('pending', 'running') FOR UPDATE),"
                    " c AS (UPDATE dtask_children c SET state = 'failed', error = :error,"
                    "   owner = NULL, lease_expires_at = NULL, finished_at = now(),"
                    "   updated_at = now(),"
                    # out of its message for good: a rerun's pending again is not covered
                    "   sent_at = coalesce(sent_at, now())"
                    "   FROM old WHERE c.id = old.id RETURNING old.unsent),"
                    # and counted out of the message a worker owns that covered it
                    " m AS (UPDATE dtask_messages m SET children = children - 1"
                    "   WHERE m.run_id = :run AND m.owner IS NOT NULL"
                    "   AND :index BETWEEN m.lo AND m.hi AND (SELECT unsent FROM c))"
                    " SELECT count(*) AS n FROM c"
                ),
                {"run": run_id, "index": index, "error": error},
            ).one()
            return int(row.n) == 1


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
