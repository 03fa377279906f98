"""The store: every SQL statement dtask runs. PostgreSQL is the source of truth.

Each state change is a conditional UPDATE (``WHERE state = … [AND fence = …]``), so a duplicated
or late broker message can never move a run or child the wrong way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from psycopg.errors import IdleInTransactionSessionTimeout
from sqlalchemy import Connection, Engine, Row, text
from sqlalchemy.exc import InternalError, OperationalError, ProgrammingError

from dtask.db.engine import unreachable
from dtask.exceptions import DatabaseUnavailable, DtaskError, KeyConflict, LeaseLost, RunNotFound
from dtask.runs import (
    ChildCounts,
    ChildState,
    ClaimRefusal,
    RunState,
    RunStatus,
    outcome,
    refuse_claim,
    sources,
)
from dtask.settings import mask

_LOCK_NAMESPACE = 0x64746B  # "dtk": keeps our advisory locks apart from the application's
_REAPER_NAMESPACE = 0x64746C

# Statements are parsed once per process: building a TextClause costs more than a short
# child's whole UPDATE round trip.
_sql = lru_cache(maxsize=None)(text)

_RUN_COLUMNS = (
    "id, template, trigger_key, variables, state, created_at, finished_at, error, schedule, slot"
)


@dataclass(frozen=True)
class RunRecord:
    id: int
    template: str
    key: str
    variables: dict[str, Any]
    state: RunState
    max_attempts: int
    queue: str | None
    child_total: int | None
    group_id: str | None
    chord_size: int | None
    dispatches: int


@dataclass(frozen=True)
class NewRun:
    template: str
    key: str
    variables: dict[str, Any]
    max_attempts: int
    queue: str | None
    schedule: str | None = None
    slot: datetime | None = None


def insert_run(conn: Connection, run: NewRun) -> int | None:
    """Insert a pending run unless its trigger key exists (exactly once per key): its id, or
    None when the key was taken."""
    row = conn.execute(
        _sql(
            "INSERT INTO dtask_runs"
            " (template, trigger_key, variables, max_attempts, queue, schedule, slot)"
            " VALUES (:template, :key, CAST(:variables AS jsonb), :max_attempts, :queue,"
            " :schedule, :slot)"
            " ON CONFLICT (trigger_key) DO NOTHING RETURNING id"
        ),
        {**asdict(run), "variables": json.dumps(run.variables)},
    ).first()
    return None if row is None else int(row.id)


@dataclass(frozen=True)
class Claim:
    """A child this worker now owns: write with ``fence`` or lose the write."""

    child_id: int
    fence: int
    attempt: int
    max_attempts: int
    spec: dict[str, Any]
    checkpoint: Any


@dataclass(frozen=True)
class Redispatch:
    """Everything needed to re-send one child message with its original identity."""

    run_id: int
    index: int
    spec: dict[str, Any]
    template: str
    group_id: str
    queue: str | None


@dataclass(frozen=True)
class Refusal:
    reason: ClaimRefusal
    error: str | None = None


class Store:
    """``lease_engine`` (an autocommit engine; default: ``engine`` in autocommit) runs a child
    owner's claim, heartbeat and state writes. services.store() gives it sessions that do not
    wait for the WAL flush: if PostgreSQL crashes, such a write may be lost, and the fence makes
    that safe (a lost claim leaves the child pending, a lost finish leaves a lease that expires
    and the child re-runs from its checkpoint). Checkpoints and every run transition stay
    durable, and a durable commit also flushes every earlier asynchronous one."""

    def __init__(self, engine: Engine, lease_engine: Engine | None = None) -> None:
        self.engine = engine
        self.lease_engine = lease_engine or engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def _tx(self, autocommit: bool = False, lease: bool = False) -> Iterator[Connection]:
        """A transaction; or, with ``autocommit``, a connection whose every statement commits
        on its own. A child owner's writes are single conditional statements run that way, so
        an owner frozen mid-write (SIGSTOP, a paused VM) never keeps the row locked: the reaper
        skips locked rows and would otherwise never take the child over."""
        try:
            if lease:  # an autocommit engine: no isolation switch per checkout
                with self.lease_engine.connect() as c:
                    yield c
            elif autocommit:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    yield c
            else:
                with self.engine.begin() as conn:
                    yield conn
        except OperationalError as exc:
            raise unreachable(exc, self.engine) from None
        except ProgrammingError as exc:
            if "does not exist" in str(exc.orig):
                raise DatabaseUnavailable(
                    f"dtask's tables are missing in {mask(str(self.engine.url))}:"
                    " run `dtask migrate`"
                ) from None
            raise

    @staticmethod
    def _lock_run(conn: Connection, run_id: int, wait: bool = True) -> bool:
        # Transaction-level only: session locks would leak across pooled connections.
        function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
        result = conn.execute(
            _sql(f"SELECT {function}(:ns, :key)"),
            {"ns": _LOCK_NAMESPACE, "key": run_id & 0x7FFFFFFF},
        ).scalar()
        return wait or bool(result)

    # --- runs ---------------------------------------------------------------------------

    def create_run(
        self,
        template: str,
        key: str,
        variables: dict[str, Any],
        max_attempts: int,
        queue: str | None,
    ) -> tuple[int, bool]:
        """Insert a run for ``key`` unless one exists. Returns (run id, created)."""
        with self._tx() as conn:
            created = insert_run(conn, NewRun(template, key, variables, max_attempts, queue))
            if created is not None:
                return created, True
            existing = conn.execute(
                _sql("SELECT id, template, variables FROM dtask_runs WHERE trigger_key = :key"),
                {"key": key},
            ).one()
        if existing.template != template or existing.variables != variables:
            raise KeyConflict(
                f"key {key!r} already triggered run {existing.id} of {existing.template!r}"
                f" with {existing.variables}; use another key for other variables"
            )
        return int(existing.id), False

    def forget_unsent_run(self, run_id: int) -> None:
        """Undo create_run when its master message could not be sent (no half-created run)."""
        with self._tx() as conn:
            conn.execute(
                _sql("DELETE FROM dtask_runs WHERE id = :id AND state = 'pending'"), {"id": run_id}
            )

    def run(self, run_id: int) -> RunRecord:
        with self._tx() as conn:
            return self._run(conn, run_id)

    @staticmethod
    def _run(conn: Connection, run_id: int) -> RunRecord:
        row = conn.execute(
            _sql(
                "SELECT id, template, trigger_key, variables, state, max_attempts, queue,"
                " child_total, group_id, chord_size, dispatches FROM dtask_runs WHERE id = :id"
            ),
            {"id": run_id},
        ).first()
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        return RunRecord(
            id=row.id,
            template=row.template,
            key=row.trigger_key,
            variables=row.variables,
            state=RunState(row.state),
            max_attempts=row.max_attempts,
            queue=row.queue,
            child_total=row.child_total,
            group_id=row.group_id,
            chord_size=row.chord_size,
            dispatches=row.dispatches,
        )

    def split_run(
        self,
        run_id: int,
        plan: Callable[[RunRecord], Sequence[dict[str, Any]]],
        wait: bool = True,
    ) -> RunState:
        """pending -> splitting: insert the children ``plan`` returns, once, under the run's lock.

        If ``plan`` raises a DtaskError the run is failed with its message. With
        ``wait=False`` a run whose lock is held (a master is on it) is left alone.
        """
        with self._tx() as conn:
            if not self._lock_run(conn, run_id, wait):
                return self._run(conn, run_id).state
            run = self._run(conn, run_id)
            if run.state is not RunState.PENDING:
                return run.state
            try:
                specs = plan(run)
            except DtaskError as exc:
                self._set_run_state(conn, run_id, RunState.FAILED, error=str(exc))
                return RunState.FAILED
            self._insert_children(conn, run_id, run.max_attempts, specs)
            conn.execute(
                _sql(
                    "UPDATE dtask_runs SET state = 'splitting', child_total = :total,"
                    " chord_size = :total, dispatches = dispatches + 1,"
                    " group_id = 'dtask-' || id || '-' || (dispatches + 1),"
                    " started_at = coalesce(started_at, now()), updated_at = now()"
                    " WHERE id = :id AND state = 'pending'"
                ),
                {"id": run_id, "total": len(specs)},
            )
            return RunState.SPLITTING

    @staticmethod
    def _insert_children(
        conn: Connection, run_id: int, max_attempts: int, specs: Sequence[dict[str, Any]]
    ) -> None:
        raw = conn.connection.driver_connection
        assert raw is not None
        with (
            raw.cursor() as cursor,
            cursor.copy(
                "COPY dtask_children (run_id, index, spec, max_attempts) FROM STDIN"
            ) as copy,
        ):
            for index, spec in enumerate(specs):
                copy.write_row((run_id, index, json.dumps(spec), max_attempts))

    def dispatch_run(
        self,
        run_id: int,
        send: Callable[[RunRecord, list[tuple[int, dict[str, Any]]]], None],
        wait: bool = True,
    ) -> RunState:
        """splitting -> running: ``send`` the chord of unfinished children, under the run's lock.

        The chord's group id and size were fixed when the group was created (split or rerun).
        A master that died mid-send left the run in ``splitting``; the next master message
        sends again with the same group, so the chord still completes once.
        """
        with self._tx() as conn:
            if not self._lock_run(conn, run_id, wait):
                return self._run(conn, run_id).state
            run = self._run(conn, run_id)
            if run.state is not RunState.SPLITTING:
                return run.state
            children = [
                (int(index), spec)
                for index, spec in conn.execute(
                    _sql(
                        "SELECT index, spec FROM dtask_children WHERE run_id = :id"
                        " AND state IN ('pending', 'running') ORDER BY index"
                    ),
                    {"id": run_id},
                )
            ]
            send(run, children)
            conn.execute(
                _sql(
                    "UPDATE dtask_runs SET state = 'running', updated_at = now()"
                    " WHERE id = :id AND state = 'splitting'"
                ),
                {"id": run_id},
            )
            return RunState.RUNNING

    def cancel_run(self, run_id: int) -> RunState:
        """pending|splitting|running -> cancelled. Pending children never start; running ones
        stop at their next checkpoint and go back to pending (a rerun resumes them)."""
        with self._tx() as conn:
            self._lock_run(conn, run_id)
            run = self._run(conn, run_id)
            if run.state.finished:
                return run.state
            self._set_run_state(conn, run_id, RunState.CANCELLED, error="cancelled")
            return RunState.CANCELLED

    def rerun(self, run_id: int) -> RunState:
        """failed|cancelled -> pending (never split) or splitting (a new chord of the children
        that did not succeed, failed ones with fresh attempts, each from its checkpoint).
        Other states are returned unchanged: a rerun is idempotent."""
        with self._tx() as conn:
            self._lock_run(conn, run_id)
            run = self._run(conn, run_id)
            if run.state not in (RunState.FAILED, RunState.CANCELLED):
                return run.state
            if run.child_total is None:
                self._set_run_state(conn, run_id, RunState.PENDING)
                return RunState.PENDING
            conn.execute(
                _sql(
                    "UPDATE dtask_children SET state = 'pending', attempt = 0, error = NULL,"
                    " finished_at = NULL, updated_at = now()"
                    " WHERE run_id = :id AND state = 'failed'"
                ),
                {"id": run_id},
            )
            conn.execute(
                _sql(
                    "UPDATE dtask_runs SET state = 'splitting', error = NULL, finished_at = NULL,"
                    " dispatches = dispatches + 1,"
                    " group_id = 'dtask-' || id || '-' || (dispatches + 1),"
                    " chord_size = (SELECT count(*) FROM dtask_children"
                    "   WHERE run_id = :id AND state <> 'succeeded'),"
                    " updated_at = now() WHERE id = :id"
                ),
                {"id": run_id},
            )
            return RunState.SPLITTING

    def finalize_run(self, run_id: int) -> RunState:
        """running -> succeeded|failed once every child has finished; otherwise a no-op."""
        with self._tx() as conn:
            self._lock_run(conn, run_id)
            run = self._run(conn, run_id)
            if run.state.finished:
                return run.state
            final = outcome(self._counts(conn, run_id))
            if final is None:
                return run.state
            error = self._failure_summary(conn, run_id) if final is RunState.FAILED else None
            self._set_run_state(conn, run_id, final, error=error)
            return final

    @staticmethod
    def _set_run_state(
        conn: Connection, run_id: int, state: RunState, error: str | None = None
    ) -> bool:
        finished = "now()" if state.finished else "NULL"
        result = conn.execute(
            _sql(
                f"UPDATE dtask_runs SET state = :state, error = :error, finished_at = {finished},"
                " updated_at = now() WHERE id = :id AND state = ANY(:sources)"
            ),
            {"id": run_id, "state": state.value, "error": error, "sources": sources(state)},
        )
        return result.rowcount == 1

    @staticmethod
    def _failure_summary(conn: Connection, run_id: int) -> str:
        failed = conn.execute(
            _sql(
                "SELECT index AS child, error, count(*) OVER () AS n FROM dtask_children"
                " WHERE run_id = :id AND state = 'failed' ORDER BY index LIMIT 3"
            ),
            {"id": run_id},
        ).all()
        total = failed[0].n if failed else 0
        shown = "; ".join(f"child {r.child}: {r.error}" for r in failed)
        return f"{total} child task(s) failed: {shown}"

    @staticmethod
    def _counts(conn: Connection, run_id: int) -> ChildCounts:
        rows = conn.execute(
            _sql(
                "SELECT state, count(*) AS n FROM dtask_children WHERE run_id = :id GROUP BY state"
            ),
            {"id": run_id},
        )
        return ChildCounts.from_states({r.state: r.n for r in rows})

    def status(self, run_id: int) -> RunStatus:
        with self._tx() as conn:
            row = conn.execute(
                _sql(f"SELECT {_RUN_COLUMNS} FROM dtask_runs WHERE id = :id"), {"id": run_id}
            ).first()
            if row is None:
                raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
            return _status(row, self._counts(conn, run_id))

    def statuses(self, limit: int = 50, schedule: str | None = None) -> list[RunStatus]:
        """The latest runs, newest first; only the runs of ``schedule`` if given."""
        where = "" if schedule is None else "WHERE schedule = :schedule"
        with self._tx() as conn:
            rows = conn.execute(
                _sql(
                    f"SELECT {_RUN_COLUMNS} FROM dtask_runs {where} ORDER BY id DESC LIMIT :limit"
                ),
                {"limit": limit, "schedule": schedule},
            ).all()
            counts: dict[int, dict[str, int]] = {r.id: {} for r in rows}
            for c in conn.execute(
                _sql(
                    "SELECT run_id, state, count(*) AS n FROM dtask_children"
                    " WHERE run_id = ANY(:ids) GROUP BY run_id, state"
                ),
                {"ids": list(counts)},
            ):
                counts[c.run_id][c.state] = c.n
        return [_status(r, ChildCounts.from_states(counts[r.id])) for r in rows]

    # --- children -----------------------------------------------------------------------

    def claim_child(self, run_id: int, index: int, owner: str, lease_ttl: float) -> Claim | Refusal:
        """Take the child (pending, or running with an expired lease): the fence moves.

        Every statement here is conditional on its own, so each commits by itself: no
        transaction round trips on the path every child takes."""
        with self._tx(autocommit=True, lease=True) as conn:
            row = conn.execute(
                _sql(
                    "UPDATE dtask_children SET state = 'running', attempt = attempt + 1,"
                    " fence = fence + 1, owner = :owner,"
                    " lease_expires_at = now() + make_interval(secs => :ttl),"
                    " started_at = coalesce(started_at, now()), updated_at = now()"
                    " WHERE run_id = :run AND index = :index AND attempt < max_attempts"
                    " AND (state = 'pending' OR (state = 'running' AND lease_expires_at < now()))"
                    " AND EXISTS (SELECT 1 FROM dtask_runs r WHERE r.id = :run"
                    "   AND r.state IN ('splitting', 'running'))"
                    " RETURNING id, fence, attempt, max_attempts, spec, checkpoint"
                ),
                {"run": run_id, "index": index, "owner": owner, "ttl": lease_ttl},
            ).first()
            if row is not None:
                return Claim(
                    child_id=row.id,
                    fence=row.fence,
                    attempt=row.attempt,
                    max_attempts=row.max_attempts,
                    spec=row.spec,
                    checkpoint=row.checkpoint,
                )
            current = conn.execute(
                _sql(
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
                _sql(
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

    def _fenced_update(
        self, claim: Claim, assignments: str, durable: bool = False, **params: Any
    ) -> None:
        """Write to a child we own: only while its fence is ours and it is running.
        A stale owner matches no row and gets LeaseLost."""
        with self._tx(autocommit=True, lease=not durable) as conn:
            result = conn.execute(
                _sql(
                    f"UPDATE dtask_children SET {assignments}, updated_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                ),
                {"id": claim.child_id, "fence": claim.fence, **params},
            )
            if result.rowcount != 1:
                raise LeaseLost(_lease_lost(claim))

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

    def finish_child(self, claim: Claim, final_checkpoint: Any | None) -> None:
        """running -> succeeded under our fence, or raise LeaseLost."""
        self._fenced_update(
            claim,
            "state = 'succeeded', finished_at = now(),"
            " checkpoint = coalesce(CAST(:cp AS jsonb), checkpoint), owner = NULL,"
            " lease_expires_at = NULL, error = NULL",
            cp=_json_or_none(final_checkpoint),
        )

    def fail_attempt(self, claim: Claim, error: str) -> ChildState:
        """Record a failed attempt: back to pending for a retry, or failed when none are left."""
        with self._tx(autocommit=True, lease=True) as conn:
            row = conn.execute(
                _sql(
                    "UPDATE dtask_children SET"
                    " state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'pending' END,"
                    " error = CASE WHEN attempt >= max_attempts"
                    "   THEN 'gave up after ' || attempt || ' attempt(s): ' || :error"
                    "   ELSE :error END,"
                    " finished_at = CASE WHEN attempt >= max_attempts THEN now() END,"
                    " owner = NULL, lease_expires_at = NULL, updated_at = now()"
                    " WHERE id = :id AND fence = :fence AND state = 'running'"
                    " RETURNING state"
                ),
                {"id": claim.child_id, "fence": claim.fence, "error": error},
            ).first()
        if row is None:
            raise LeaseLost(_lease_lost(claim))
        return ChildState(row.state)

    def renew_lease(self, claim: Claim, lease_ttl: float) -> RunState | None:
        """Heartbeat: extend our lease; return the run's state (a cancel shows up here), or
        None when the fence has moved (we lost the child)."""
        with self._tx(autocommit=True, lease=True) as conn:
            row = conn.execute(
                _sql(
                    "UPDATE dtask_children c"
                    " SET lease_expires_at = now() + make_interval(secs => :ttl)"
                    " FROM dtask_runs r WHERE c.id = :id AND c.fence = :fence"
                    " AND c.state = 'running' AND r.id = c.run_id RETURNING r.state"
                ),
                {"id": claim.child_id, "fence": claim.fence, "ttl": lease_ttl},
            ).first()
            return None if row is None else RunState(row.state)

    def release_child(self, claim: Claim, checkpoint: Any | None) -> None:
        """Hand the child back (stopped at a checkpoint): pending again, this attempt not
        counted, resumable from ``checkpoint``."""
        self._fenced_update(
            claim,
            "state = 'pending', attempt = attempt - 1,"
            " checkpoint = coalesce(CAST(:cp AS jsonb), checkpoint), owner = NULL,"
            " lease_expires_at = NULL",
            cp=_json_or_none(checkpoint),
        )

    def child_error(self, run_id: int, index: int) -> str | None:
        with self._tx() as conn:
            row = conn.execute(
                _sql("SELECT error FROM dtask_children WHERE run_id = :run AND index = :index"),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else row.error

    # --- the reaper ---------------------------------------------------------------------

    @contextmanager
    def _held(self, hold_for: float, held_too_long: DtaskError) -> Iterator[Connection]:
        """A transaction PostgreSQL ends once it has sat idle for ``hold_for`` seconds, so a
        holder that hangs (SIGSTOP, swap, a paused VM) cannot keep its locks; the woken holder
        gets ``held_too_long`` and nothing of its transaction is recorded."""
        try:
            with self._tx() as conn:
                conn.execute(
                    _sql("SELECT set_config('idle_in_transaction_session_timeout', :ms, true)"),
                    {"ms": str(int(hold_for * 1000))},
                )
                yield conn
        except InternalError as exc:
            if not isinstance(exc.orig, IdleInTransactionSessionTimeout):
                raise
            raise held_too_long from None

    @contextmanager
    def reaper_turn(self, hold_for: float) -> Iterator[bool]:
        """True inside the block for one caller cluster-wide at a time.

        A hung leader would block failover everywhere: it loses its turn after ``hold_for``
        seconds idle (see ``_held``), so a survivor takes over. Every reaper action is
        conditional and idempotent, so a woken leader overlapping a new one is harmless.
        """
        lost = LeaseLost(
            "the reaper's turn ended: held past its limit (this worker was paused, or the"
            " pass ran long); another worker reaps now"
        )
        with self._held(hold_for, lost) as conn:
            yield bool(
                conn.execute(
                    _sql("SELECT pg_try_advisory_xact_lock(:ns, 0)"), {"ns": _REAPER_NAMESPACE}
                ).scalar()
            )

    def release_expired(self, limit: int = 1000) -> list[Redispatch]:
        """Expired leases (their owner died or hung) -> pending again, to be re-sent at once.

        The dead owner's attempt stays counted, so a child that kills its process every time
        runs out of attempts instead of looping.
        """
        with self._tx() as conn:
            rows = conn.execute(
                _sql(
                    "UPDATE dtask_children c SET state = 'pending', owner = NULL,"
                    " lease_expires_at = NULL, updated_at = now()"
                    " FROM dtask_runs r WHERE c.id IN ("
                    "   SELECT id FROM dtask_children WHERE state = 'running'"
                    "   AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT :limit"
                    "   FOR UPDATE SKIP LOCKED)"
                    " AND r.id = c.run_id AND r.state = 'running'"
                    " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue"
                ),
                {"limit": limit},
            ).all()
        return [_redispatch(r) for r in rows]

    def stalled_runs(self, stall: float) -> list[tuple[int, str | None]]:
        """(run id, queue) of running runs with pending children where no child has changed
        for ``stall`` seconds: their messages may be lost (broker restarted, or prefetched
        by a worker that died). Heartbeats do not count as change."""
        with self._tx() as conn:
            rows = conn.execute(
                _sql(
                    "SELECT r.id, r.queue FROM dtask_runs r WHERE r.state = 'running'"
                    " AND r.updated_at < now() - make_interval(secs => :stall)"
                    " AND EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.state = 'pending')"
                    " AND NOT EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.updated_at > now() - make_interval(secs => :stall))"
                    " ORDER BY r.id LIMIT 100"
                ),
                {"stall": stall},
            ).all()
        return [(int(r.id), r.queue) for r in rows]

    def pending_children(self, run_id: int, limit: int = 10_000) -> list[Redispatch]:
        """The run's pending children, to re-send; marks the run touched so this is rate-limited
        to once per stall period."""
        with self._tx() as conn:
            conn.execute(
                _sql("UPDATE dtask_runs SET updated_at = now() WHERE id = :id"), {"id": run_id}
            )
            rows = conn.execute(
                _sql(
                    "SELECT c.run_id, c.index, c.spec, r.template, r.group_id, r.queue"
                    " FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                    " WHERE c.run_id = :id AND c.state = 'pending' ORDER BY c.index LIMIT :limit"
                ),
                {"id": run_id, "limit": limit},
            ).all()
        return [_redispatch(r) for r in rows]

    def stuck_runs(self, stall: float) -> list[tuple[int, RunState]]:
        """Runs left in pending/splitting for ``stall`` seconds with no master working on them
        (its advisory lock is free): the submitter or the master's worker died, or the master
        message is lost."""
        with self._tx() as conn:
            rows = conn.execute(
                _sql(
                    "SELECT id, state FROM dtask_runs WHERE state IN ('pending', 'splitting')"
                    " AND updated_at < now() - make_interval(secs => :stall) ORDER BY id LIMIT 100"
                ),
                {"stall": stall},
            ).all()
        return [(int(r.id), RunState(r.state)) for r in rows]

    def unfinalized_runs(self, settled_for: float) -> list[int]:
        """Running runs whose children all finished over ``settled_for`` seconds ago: their
        chord callback never ran (lost with its worker, or Redis lost the chord's counts)."""
        with self._tx() as conn:
            rows = conn.execute(
                _sql(
                    "SELECT r.id FROM dtask_runs r WHERE r.state = 'running'"
                    " AND NOT EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.state IN ('pending', 'running'))"
                    " AND (SELECT max(finished_at) FROM dtask_children c WHERE c.run_id = r.id)"
                    "   < now() - make_interval(secs => :settled)"
                    " ORDER BY r.id LIMIT 100"
                ),
                {"settled": settled_for},
            ).all()
        return [int(r.id) for r in rows]


def _json_or_none(value: Any | None) -> str | None:
    return None if value is None else json.dumps(value)


def _exhausted(attempts: int, last_error: str | None) -> str:
    reason = last_error or "its worker process died while running it"
    if reason.startswith("gave up after"):
        return reason
    return f"gave up after {attempts} attempt(s): {reason}"


def _lease_lost(claim: Claim) -> str:
    return (
        f"child {claim.child_id} was taken over by another worker (fence {claim.fence} is stale);"
        " this worker stops working on it"
    )


def _status(row: Row[Any], counts: ChildCounts) -> RunStatus:
    return RunStatus(
        id=row.id,
        template=row.template,
        key=row.trigger_key,
        state=RunState(row.state),
        variables=row.variables,
        children=counts,
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
        schedule=row.schedule,
        slot=row.slot,
    )


def _redispatch(row: Row[Any]) -> Redispatch:
    return Redispatch(
        run_id=int(row.run_id),
        index=int(row._mapping["index"]),
        spec=row.spec,
        template=row.template,
        group_id=row.group_id,
        queue=row.queue,
    )
