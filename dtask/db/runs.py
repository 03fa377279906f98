"""Runs: created once per trigger key, split, dispatched, cancelled, rerun and finalized, each
move a conditional UPDATE under the run's advisory lock."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from dtask.db import counters
from dtask.db.clients import check_rates, lock_client
from dtask.db.database import Database, lock_run, sql
from dtask.db.run_reads import RunReads, child_results
from dtask.domain.clients import DEFAULT_CLIENT, DEFAULT_PRIORITY, Tier
from dtask.domain.deadlines import OnLate
from dtask.domain.runs import RunState, outcome, sources
from dtask.domain.tiers import tier_queue
from dtask.exceptions import DtaskError, KeyConflict, RateLimited, RunNotFound, UnknownTemplate


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
    idle: float = 0.0  # seconds since the run last changed (e.g. became pending), by PostgreSQL
    tier: Tier = Tier.BASIC
    starts_in: float = 0.0  # seconds until it may split (apply_async's countdown or eta)


# (the run, a loader of its children's results in index order) -> its result as JSON text
Reducer = Callable[[RunRecord, Callable[[], list[Any]]], str | None]


@dataclass(frozen=True)
class NewRun:
    template: str
    key: str
    variables: dict[str, Any]
    max_attempts: int
    queue: str | None
    schedule: str | None = None
    slot: datetime | None = None
    execution_cap: float | None = None  # overrides the template's
    client: str = DEFAULT_CLIENT
    priority: int = DEFAULT_PRIORITY
    expected_children: int | None = None
    delay_tolerance: float | None = None  # the deadline is the slot (or now) plus this
    on_late: OnLate = OnLate.RUN
    tier: Tier = Tier.BASIC  # ``queue`` is already the tier's queue
    notify_url: str | None = None  # POSTed the run's JSON when it finishes
    start_at: datetime | None = None  # not split before this (eta)...
    start_in: float | None = None  # ...or this many seconds from now (countdown)


_START = (
    "coalesce(CAST(:start_at AS timestamptz),"
    " clock_timestamp() + make_interval(secs => CAST(:start_in AS double precision)))"
)


def insert_run(conn: Connection, run: NewRun) -> int | None:
    """Insert a pending run unless its trigger key exists (exactly once per key): its id, or
    None when the key was taken."""
    row = conn.execute(
        sql(
            "INSERT INTO dtask_runs"
            " (template, trigger_key, variables, max_attempts, queue, schedule, slot,"
            " execution_cap, client, priority, expected_children, created_at,"
            " delay_tolerance, on_late, deadline, tier, notify_url, notify_state, start_after)"
            " VALUES (:template, :key, CAST(:variables AS jsonb), :max_attempts, :queue,"
            " :schedule, :slot, :execution_cap, :client, :priority, :expected_children,"
            " clock_timestamp(), :delay_tolerance, :on_late,"
            " coalesce(:slot, " + _START + ", clock_timestamp())"
            " + make_interval(secs => :delay_tolerance),"
            " :tier, CAST(:notify_url AS text),"
            " CASE WHEN CAST(:notify_url AS text) IS NULL THEN NULL ELSE 'waiting' END,"
            " " + _START + ")"
            " ON CONFLICT (trigger_key) DO NOTHING RETURNING id"
        ),
        {
            **asdict(run),
            "variables": json.dumps(run.variables),
            "on_late": run.on_late.value,
            "tier": run.tier.value,
        },
    ).first()
    return None if row is None else int(row.id)


class RunStore(RunReads):
    """The writes; the reads (status, lists) are in :class:`RunReads`."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.counters = counters.CounterStore(db)

    def create(
        self,
        template: str,
        key: str,
        variables: dict[str, Any],
        max_attempts: int,
        queue: str | None,
        execution_cap: float | None = None,
        *,
        client: str = DEFAULT_CLIENT,
        priority: int | None = None,
        expected_children: int | None = None,
        delay_tolerance: float | None = None,
        on_late: OnLate = OnLate.RUN,
        tier: Tier | None = None,
        notify_url: str | None = None,
        start_at: datetime | None = None,
        start_in: float | None = None,
    ) -> tuple[int, bool]:
        """Insert a run for ``key`` unless one exists. Returns (run id, created).

        A new run is charged to ``client`` (RateLimited when its rate limits refuse it); a
        known key returns its run and costs nothing. Its children go to the queue of the
        tier it gets (``tier``, capped by the client's)."""
        try:
            with self.db.tx() as conn:
                existing = self._by_key(conn, key)
                if existing is None:
                    charged = lock_client(conn, client)
                    # a submit of the same key may have committed while this one waited
                    existing = self._by_key(conn, key)
                if existing is None:
                    check_rates(conn, charged, expected_children)
                    granted = charged.tier_for(tier)
                    new = NewRun(
                        template, key, variables, max_attempts, tier_queue(queue, granted),
                        execution_cap=execution_cap, client=charged.name,
                        priority=charged.priority_for(priority),
                        expected_children=expected_children,
                        delay_tolerance=delay_tolerance, on_late=on_late, tier=granted,
                        notify_url=notify_url, start_at=start_at, start_in=start_in,
                    )  # fmt: skip
                    created = insert_run(conn, new)
                    if created is not None:
                        return created, True
                    existing = self._by_key(conn, key)
                assert existing is not None
        except RateLimited:  # counted once its transaction is rolled back
            self.counters.add(counters.RATE_LIMITED, label=client)
            raise
        if existing.template != template or existing.variables != variables:
            raise KeyConflict(
                f"key {key!r} already triggered run {existing.id} of {existing.template!r}"
                f" with {existing.variables}; use another key for other variables"
            )
        return int(existing.id), False

    @staticmethod
    def _by_key(conn: Connection, key: str) -> Row[Any] | None:
        return conn.execute(
            sql("SELECT id, template, variables FROM dtask_runs WHERE trigger_key = :key"),
            {"key": key},
        ).first()

    def forget_unsent(self, run_id: int) -> None:
        """Undo create_run when its master message could not be sent (no half-created run)."""
        with self.db.tx() as conn:
            conn.execute(
                sql("DELETE FROM dtask_runs WHERE id = :id AND state = 'pending'"), {"id": run_id}
            )

    def get(self, run_id: int) -> RunRecord:
        with self.db.tx() as conn:
            return self._record(conn, run_id)

    @staticmethod
    def _record(conn: Connection, run_id: int) -> RunRecord:
        row = conn.execute(
            sql(
                "SELECT id, template, trigger_key, variables, state, max_attempts, queue,"
                " child_total, group_id, chord_size, dispatches, tier,"
                " extract(epoch FROM now() - updated_at) AS idle,"
                " coalesce(greatest(extract(epoch FROM start_after - now()), 0), 0) AS starts_in"
                " FROM dtask_runs WHERE id = :id"
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
            idle=float(row.idle),
            tier=Tier(row.tier),
            starts_in=float(row.starts_in),
        )

    def split(
        self,
        run_id: int,
        plan: Callable[[RunRecord], Sequence[dict[str, Any]]],
        wait: bool = True,
        deferred: bool = False,
    ) -> RunState:
        """pending -> splitting: insert the children ``plan`` returns, once, under the run's lock.

        If ``plan`` raises a DtaskError the run is failed with its message. With
        ``wait=False`` a run whose lock is held (a master is on it) is left alone. With
        ``deferred`` the children wait unsent for the dispatcher (DTASK_DISPATCH=window).
        """
        with self.db.tx() as conn:
            if not lock_run(conn, run_id, wait):
                return self._record(conn, run_id).state
            run = self._record(conn, run_id)
            if run.state is not RunState.PENDING or run.starts_in > 0:
                return run.state
            try:
                specs = plan(run)
            except DtaskError as exc:
                self._set_run_state(conn, run_id, RunState.FAILED, error=str(exc))
                return RunState.FAILED
            self._insert_children(conn, run_id, run.max_attempts, specs, deferred)
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET state = 'splitting', child_total = :total,"
                    " unsent = CASE WHEN :deferred THEN :total ELSE 0 END,"
                    " chord_size = :total, dispatches = dispatches + 1,"
                    " group_id = 'dtask-' || id || '-' || (dispatches + 1),"
                    " started_at = coalesce(started_at, now()), updated_at = now()"
                    " WHERE id = :id AND state = 'pending'"
                ),
                {"id": run_id, "total": len(specs), "deferred": deferred},
            )
            return RunState.SPLITTING

    @staticmethod
    def _insert_children(
        conn: Connection,
        run_id: int,
        max_attempts: int,
        specs: Sequence[dict[str, Any]],
        deferred: bool,
    ) -> None:
        raw = conn.connection.driver_connection
        assert raw is not None
        columns = "run_id, index, spec, max_attempts" + (", sent_at" if deferred else "")
        with (
            raw.cursor() as cursor,
            cursor.copy(f"COPY dtask_children ({columns}) FROM STDIN") as copy,
        ):
            for index, spec in enumerate(specs):
                row = (run_id, index, json.dumps(spec), max_attempts)
                copy.write_row((*row, None) if deferred else row)

    def dispatch(
        self,
        run_id: int,
        send: Callable[[RunRecord, list[tuple[int, dict[str, Any]]]], None],
        wait: bool = True,
        deferred: bool = False,
    ) -> RunState:
        """splitting -> running: ``send`` the chord of unfinished children, under the run's lock.
        With ``deferred``, ``send`` gets no children (it fixes the chord's size): its pending
        children wait unsent for the dispatcher.

        The chord's group id and size were fixed when the group was created (split or rerun).
        A master that died mid-send left the run in ``splitting``; the next master message
        sends again with the same group, so the chord still completes once.
        """
        with self.db.tx() as conn:
            if not lock_run(conn, run_id, wait):
                return self._record(conn, run_id).state
            run = self._record(conn, run_id)
            if run.state is not RunState.SPLITTING:
                return run.state
            if deferred:
                self._defer_pending(conn, run_id)
                send(run, [])
                return self._running(conn, run_id)
            # sent now: children split long ago (a stuck run, a rerun) must not look lost
            conn.execute(
                sql(
                    "UPDATE dtask_children SET sent_at = now() WHERE run_id = :id"
                    " AND state = 'pending' AND sent_at < now() - interval '1 second'"
                ),
                {"id": run_id},
            )
            children = [
                (int(index), spec)
                for index, spec in conn.execute(
                    sql(
                        "SELECT index, spec FROM dtask_children WHERE run_id = :id"
                        " AND state IN ('pending', 'running') ORDER BY index"
                    ),
                    {"id": run_id},
                )
            ]
            send(run, children)
            return self._running(conn, run_id)

    @staticmethod
    def _running(conn: Connection, run_id: int) -> RunState:
        conn.execute(
            sql(
                "UPDATE dtask_runs SET state = 'running', updated_at = now()"
                " WHERE id = :id AND state = 'splitting'"
            ),
            {"id": run_id},
        )
        return RunState.RUNNING

    @staticmethod
    def _defer_pending(conn: Connection, run_id: int) -> None:
        """Every pending child of the run waits for the dispatcher (a rerun's, a stuck run's
        children that were sent long ago are sent again by it)."""
        conn.execute(
            sql(
                "UPDATE dtask_children SET sent_at = NULL WHERE run_id = :id"
                " AND state = 'pending' AND sent_at IS NOT NULL"
            ),
            {"id": run_id},
        )
        conn.execute(
            sql(
                "UPDATE dtask_runs SET unsent = (SELECT count(*) FROM dtask_children"
                " WHERE run_id = :id AND state = 'pending' AND sent_at IS NULL) WHERE id = :id"
            ),
            {"id": run_id},
        )

    def cancel(self, run_id: int) -> RunState:
        """pending|splitting|running -> cancelled. Pending children never start; running ones
        stop at their next checkpoint and go back to pending (a rerun resumes them)."""
        with self.db.tx() as conn:
            lock_run(conn, run_id)
            run = self._record(conn, run_id)
            if run.state.finished:
                return run.state
            self._set_run_state(conn, run_id, RunState.CANCELLED, error="cancelled")
            return RunState.CANCELLED

    def rerun(self, run_id: int) -> RunState:
        """failed|cancelled -> pending (never split) or splitting (a new chord of the children
        that did not succeed, failed ones with fresh attempts, each from its checkpoint).
        Other states are returned unchanged: a rerun is idempotent."""
        with self.db.tx() as conn:
            lock_run(conn, run_id)
            run = self._record(conn, run_id)
            if run.state not in (RunState.FAILED, RunState.CANCELLED):
                return run.state
            if run.child_total is None:
                self._set_run_state(conn, run_id, RunState.PENDING)
                return RunState.PENDING
            conn.execute(
                sql(
                    "UPDATE dtask_children SET state = 'pending', attempt = 0, error = NULL,"
                    " finished_at = NULL, updated_at = now()"
                    " WHERE run_id = :id AND state = 'failed'"
                ),
                {"id": run_id},
            )
            conn.execute(
                sql(
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

    def finalize(self, run_id: int, wait: bool = True, reduce: Reducer | None = None) -> RunState:
        """running -> succeeded|failed once every child has finished; otherwise a no-op.
        With ``wait=False`` a run whose lock is held is left as it is. A succeeding run's
        result is ``reduce(run, children's results)`` (JSON text), computed between two
        transactions, so no lock is held while that user code runs: the second one writes only
        if the run is still the same dispatch, finished. A DtaskError from the reduce fails the
        run with its message; UnknownTemplate leaves the run to a process that knows it."""
        reduced: tuple[int, str | None, str | None] | None = None  # dispatch, result, error
        if reduce is not None:
            with self.db.tx() as conn:
                run = self._record(conn, run_id)
                done = run.state is RunState.RUNNING and (
                    outcome(self._counts(conn, run_id)) is RunState.SUCCEEDED
                )
                results = child_results(conn, run_id) if done else []
            if done:
                try:
                    reduced = (run.dispatches, reduce(run, lambda: results), None)
                except UnknownTemplate:
                    return run.state
                except DtaskError as exc:
                    reduced = (run.dispatches, None, str(exc))
        with self.db.tx() as conn:
            if not lock_run(conn, run_id, wait):
                return self._record(conn, run_id).state
            run = self._record(conn, run_id)
            if run.state.finished:
                return run.state
            final = outcome(self._counts(conn, run_id))
            if final is None:
                return run.state
            error = self._failure_summary(conn, run_id) if final is RunState.FAILED else None
            result = None
            if final is RunState.SUCCEEDED and reduce is not None:
                if reduced is None or reduced[0] != run.dispatches:
                    return run.state  # reduced for another dispatch (a rerun): not ours
                _, result, failed = reduced
                if failed is not None:
                    final, error = RunState.FAILED, failed
            # a rerun's run is splitting: its own chord finalizes it, not this late callback
            changed = self._set_run_state(conn, run_id, final, error=error, result=result)
            return final if changed else run.state

    @staticmethod
    def _set_run_state(
        conn: Connection,
        run_id: int,
        state: RunState,
        error: str | None = None,
        result: str | None = None,
    ) -> bool:
        finished = "now()" if state.finished else "NULL"
        changed = conn.execute(
            sql(
                f"UPDATE dtask_runs SET state = :state, error = :error, finished_at = {finished},"
                " result = CAST(:result AS jsonb), updated_at = now()"
                " WHERE id = :id AND state = ANY(:sources)"
            ),
            {
                "id": run_id,
                "state": state.value,
                "error": error,
                "result": result,
                "sources": sources(state),
            },
        )
        return changed.rowcount == 1

    @staticmethod
    def _failure_summary(conn: Connection, run_id: int) -> str:
        failed = conn.execute(
            sql(
                "SELECT index AS child, error, count(*) OVER () AS n FROM dtask_children"
                " WHERE run_id = :id AND state = 'failed' ORDER BY index LIMIT 3"
            ),
            {"id": run_id},
        ).all()
        total = failed[0].n if failed else 0
        shown = "; ".join(f"child {r.child}: {r.error}" for r in failed)
        return f"{total} child task(s) failed: {shown}"
