"""Runs: created once per trigger key, split, dispatched, cancelled, rerun and finalized, each
move a conditional UPDATE under the run's advisory lock."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sqlalchemy import Connection

from dtask.db import concurrency, deps, inline, statistics
from dtask.db.bulk import BulkInserts
from dtask.db.children import Finished
from dtask.db.database import lock_run, sql
from dtask.db.inline import Inline
from dtask.db.queued import unsent
from dtask.db.run_reads import child_results
from dtask.db.workers import LiveSlots, live_on
from dtask.domain.clients import Tier
from dtask.domain.deps import blocking, start_state
from dtask.domain.runs import RunState, outcome, sources
from dtask.exceptions import (
    DtaskError,
    NothingToRerun,
    RunNotFound,
    UnknownTemplate,
    UpstreamFailed,
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
    idle: float = 0.0  # seconds since the run last changed (e.g. became pending), by PostgreSQL
    tier: Tier = Tier.BASIC
    starts_in: float = 0.0  # seconds until it may split (apply_async's countdown or eta)
    chained: bool = False  # Celery chains wait for it (dtask_runs.chains)


@dataclass(frozen=True)
class Chained:
    """A finished run's kept chains, for the caller to send: its state, result and error."""

    run_id: int
    state: RunState
    result: Any
    error: str | None
    chains: list[dict[str, Any]]


# (the run, a loader of its children's results in index order) -> its result as JSON text
Reducer = Callable[[RunRecord, Callable[[], list[Any]]], str | None]
Reduced = tuple[int, str | None, str | None]  # the dispatch reduced, its result, its error
FINISHED = "'succeeded', 'failed', 'cancelled'"


class RunStore(BulkInserts):
    """The writes; creating runs is in :class:`RunInserts`, the reads (status, lists) in
    :class:`RunReads`."""

    def get(self, run_id: int) -> RunRecord:
        with self.db.tx() as conn:
            return self._record(conn, run_id)

    @staticmethod
    def _record(conn: Connection, run_id: int) -> RunRecord:
        row = conn.execute(
            sql(
                "SELECT id, template, trigger_key, variables, state, max_attempts, queue,"
                " child_total, group_id, chord_size, dispatches, tier,"
                " chains IS NOT NULL AS chained,"
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
            chained=bool(row.chained),
        )

    def split(
        self,
        run_id: int,
        plan: Callable[[RunRecord, LiveSlots], Sequence[str | Mapping[str, Any]]],
        wait: bool = True,
        deferred: bool = False,
        offer: Inline | None = None,
    ) -> RunState:
        """pending -> splitting: insert the children ``plan`` returns, once, under the run's lock
        (``plan`` may ask how many live slots the run has, on the lock's connection).

        If ``plan`` raises a DtaskError the run is failed with its message. With
        ``wait=False`` a run whose lock is held (a master is on it) is left alone. With
        ``deferred`` the children wait unsent for the dispatcher (DTASK_DISPATCH=window).

        With ``offer`` (deferred only), a run of one child that the dispatcher would send at
        once goes straight to running with its child taken for the caller, who runs it
        (:func:`dtask.db.inline.take`).

        The table's statistics are not refreshed here: the caller asks for that
        (``refresh_statistics``) once the run's first children are on their way."""
        with self.db.tx() as conn:
            if not lock_run(conn, run_id, wait):
                return self._record(conn, run_id).state
            run = self._record(conn, run_id)
            if run.state is not RunState.PENDING or run.starts_in > 0:
                return run.state
            slots = LiveSlots(partial(live_on, conn), run.queue, run.template)
            try:
                specs = plan(run, slots)
            except DtaskError as exc:
                self._set_run_state(conn, run_id, RunState.FAILED, error=str(exc))
                return RunState.FAILED
            if slots.seen is not None:  # `dtask status` says what a split by capacity saw
                conn.execute(
                    sql("UPDATE dtask_runs SET split_slots = :n WHERE id = :id"),
                    {"n": slots.seen, "id": run_id},
                )
            if offer is not None and deferred and len(specs) == 1:  # noqa: SIM102 (a write)
                if inline.take(conn, run_id, run.max_attempts, specs[0], offer):
                    offer.template = run.template
                    return RunState.RUNNING
            self._insert_children(conn, run_id, run.max_attempts, specs, deferred)
            conn.execute(
                sql(f"UPDATE dtask_runs SET {inline.SPLIT} WHERE id = :id AND state = 'pending'"),
                {
                    "id": run_id,
                    "state": RunState.SPLITTING.value,
                    "total": len(specs),
                    "unsent": len(specs) if deferred else 0,
                },
            )
        return RunState.SPLITTING

    def refresh_statistics(self, children: int) -> None:
        """After a split of ``children`` has been dispatched: its statistics work, off the
        path of its first message (``statistics.after_split``)."""
        statistics.after_split(self.db, children)

    @staticmethod
    def _insert_children(
        conn: Connection,
        run_id: int,
        max_attempts: int,
        specs: Sequence[str | Mapping[str, Any]],
        deferred: bool,
    ) -> None:
        """COPY the specs in: JSON text as the split checked it (or dicts, dumped here).

        Each row's foreign key is checked by a query PostgreSQL prepares once per transaction;
        under dtask's ``plan_cache_mode`` (every statement planned as it runs: ``Limits``) it
        was planned again for every row, two thirds of a large COPY's time. The COPY runs
        with PostgreSQL's default, and the statements after it with the session's again."""
        raw = conn.connection.driver_connection
        assert raw is not None
        columns = "run_id, index, spec, max_attempts" + (", sent_at" if deferred else "")
        with raw.cursor() as cursor:
            if len(specs) > 1:
                cursor.execute("SET LOCAL plan_cache_mode = auto")
            with cursor.copy(f"COPY dtask_children ({columns}) FROM STDIN") as copy:
                for index, spec in enumerate(specs):
                    text = spec if isinstance(spec, str) else json.dumps(spec)
                    row = (run_id, index, text, max_attempts)
                    copy.write_row((*row, None) if deferred else row)
            if len(specs) > 1:
                cursor.execute("RESET plan_cache_mode")

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
        children that were sent long ago are sent again by it): its mark goes back to the
        first child and its messages are forgotten."""
        conn.execute(
            sql(
                "UPDATE dtask_children SET sent_at = NULL WHERE run_id = :id"
                " AND state = 'pending' AND sent_at IS NOT NULL"
            ),
            {"id": run_id},
        )
        conn.execute(sql("DELETE FROM dtask_messages WHERE run_id = :id"), {"id": run_id})
        conn.execute(
            sql(
                "UPDATE dtask_runs SET sent_through = 0, unsent = (SELECT count(*)"
                f" FROM dtask_children WHERE run_id = :id AND {unsent('0')}) WHERE id = :id"
            ),
            {"id": run_id},
        )

    def cancel(self, run_id: int, terminate: bool = False) -> RunState:
        """pending|splitting|running -> cancelled. Pending children never start; running ones
        stop at their next checkpoint and go back to pending (a rerun resumes them); with
        ``terminate``, one that does not stop within DTASK_EXECUTION_CAP_GRACE has its pool
        process killed (``terminating``)."""
        with self.db.tx() as conn:
            lock_run(conn, run_id)
            run = self._record(conn, run_id)
            if run.state.finished:
                return run.state
            self._set_run_state(conn, run_id, RunState.CANCELLED, error="cancelled")
            conn.execute(
                sql("UPDATE dtask_runs SET terminate = :terminate WHERE id = :id"),
                {"id": run_id, "terminate": terminate},
            )
            return RunState.CANCELLED

    def trace_under(self, run_id: int, headers: dict[str, str] | None) -> None:
        """The run's work from now on is traced under ``headers`` (its master's span)."""
        with self.db.owner() as conn:
            conn.execute(
                sql("UPDATE dtask_runs SET trace_context = CAST(:c AS jsonb) WHERE id = :id"),
                {"id": run_id, "c": None if headers is None else json.dumps(headers)},
            )

    def terminating(self, run_id: int) -> bool:
        """Whether the run was cancelled with ``terminate`` (asked by a child's heartbeat once
        it saw the run cancelled)."""
        with self.db.owner() as conn:
            found = conn.execute(
                sql("SELECT state = 'cancelled' AND terminate FROM dtask_runs WHERE id = :id"),
                {"id": run_id},
            ).scalar()
        return bool(found)

    def rerun(self, run_id: int) -> RunState:
        """failed|cancelled -> pending or waiting (never split: waiting while an upstream runs
        again; UpstreamFailed while one is still failed) or splitting (a new chord of the
        children that did not succeed, failed ones with fresh attempts, each from its
        checkpoint). Other states are returned unchanged: a rerun is idempotent."""
        with self.db.tx() as conn:
            lock_run(conn, run_id)
            run = self._record(conn, run_id)
            if run.state not in (RunState.FAILED, RunState.CANCELLED):
                return run.state
            if run.child_total is None:
                upstreams = deps.lock_upstreams(conn, deps.upstreams_of(conn, run_id))
                state, error = start_state(upstreams)
                upstream = blocking(upstreams)
                if upstream is not None:
                    raise UpstreamFailed(
                        f"run {run_id} cannot run: {error}; rerun that one first"
                        f" (dtask rerun {upstream}), then this one"
                    )
                self._set_run_state(conn, run_id, state)
                return self._record(conn, run_id).state  # its concurrency key may hold it
            kept = conn.execute(
                sql("SELECT count(*) FROM dtask_children WHERE run_id = :id"), {"id": run_id}
            ).scalar_one()
            if kept < run.child_total:
                raise NothingToRerun(
                    f"run {run_id} is being pruned (finished longer ago than DTASK_RETENTION):"
                    " nothing to rerun; submit it again"
                )
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
                    f" {inline.NEXT_GROUP},"
                    " chord_size = (SELECT count(*) FROM dtask_children"
                    "   WHERE run_id = :id AND state <> 'succeeded'),"
                    " updated_at = now() WHERE id = :id"
                ),
                {"id": run_id},
            )
            return RunState.SPLITTING

    def finish_alone(
        self,
        run_id: int,
        done: Finished,
        chained: list[int] | None = None,
    ) -> list[int] | None:
        """A run's only child succeeded, and the run with it, in one transaction (for a run
        whose template has no reduce): :func:`dtask.db.inline.finish`."""
        with self.db.tx() as conn:
            lock_run(conn, run_id, wait=True)
            return inline.finish(conn, run_id, done, chained)

    def add_chain(self, run_id: int, chain: dict[str, Any]) -> RunState:
        """Keep ``chain`` (the rest of a Celery chain a ``dtask.submit`` task took over, as
        JSON) with the run until it has finished, under the run's lock: a finalize either
        sees it or settled the run before; the state returned says which (a finished run's
        chains are the caller's to send: :meth:`take_chains`)."""
        with self.db.tx() as conn:
            lock_run(conn, run_id)
            state = conn.execute(
                sql(
                    "UPDATE dtask_runs SET chains = coalesce(chains, '[]'::jsonb)"
                    " || CAST(:chain AS jsonb) WHERE id = :id RETURNING state"
                ),
                {"id": run_id, "chain": json.dumps([chain])},
            ).scalar()
            if state is None:
                raise RunNotFound(f"no run with id {run_id}")
            return RunState(state)

    def take_chains(self, run_id: int, send: Callable[[Chained], None]) -> bool:
        """Hand a finished run's kept chains to ``send`` (which publishes them) inside the
        transaction that clears them, holding the run's row: however many finalizers ask,
        one sends them; if ``send`` raises, they stay for a later call (the reaper's step).
        False when there is nothing to send (not finished, no chains, already sent)."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "SELECT state, result, error, chains FROM dtask_runs WHERE id = :id"
                    f" AND chains IS NOT NULL AND state IN ({FINISHED}) FOR UPDATE"
                ),
                {"id": run_id},
            ).first()
            if row is None:
                return False
            send(Chained(run_id, RunState(row.state), row.result, row.error, list(row.chains)))
            conn.execute(sql("UPDATE dtask_runs SET chains = NULL WHERE id = :id"), {"id": run_id})
            return True

    def chained_finished(self, settled_for: float, limit: int = 100) -> list[int]:
        """Finished runs (for ``settled_for`` seconds or more) whose chains were not sent: their
        finalizer could not (a cancel, a late run failed, a broker error, a crash)."""
        with self.db.tx() as conn:
            return [
                int(run_id)
                for run_id in conn.execute(
                    sql(
                        "SELECT id FROM dtask_runs WHERE chains IS NOT NULL"
                        f" AND state IN ({FINISHED})"
                        " AND finished_at < now() - make_interval(secs => :settled)"
                        " ORDER BY id LIMIT :limit"
                    ),
                    {"settled": settled_for, "limit": limit},
                ).scalars()
            ]

    def finalize(
        self,
        run_id: int,
        wait: bool = True,
        reduce: Reducer | None = None,
        released: list[int] | None = None,
        ended: list[str] | None = None,
        reduces: Callable[[str], bool] = lambda template: True,
    ) -> RunState:
        """running -> succeeded|failed once every child has finished; otherwise a no-op.
        The dependents a success releases are added to ``released``: their masters are the
        caller's to send; the chord this call ended (its group id), to ``ended``. With
        ``wait=False`` a run whose lock is held is left as it is. A succeeding run whose
        template ``reduces`` gets ``reduce(run, children's results)`` (JSON text) as its result,
        computed between two transactions, so no lock is held while that user code runs: the
        second one writes only if the run is still the same dispatch, finished (a run that
        does not reduce takes one transaction). A DtaskError from the reduce fails the run with
        its message; UnknownTemplate leaves the run to a process that knows it."""
        reduced: Reduced | None = None
        while True:
            with self.db.tx() as conn:
                if not lock_run(conn, run_id, wait):
                    return self._record(conn, run_id).state
                run = self._record(conn, run_id)
                if run.state.finished:
                    return run.state
                final = outcome(self._counts(conn, run_id))
                if final is None:
                    return run.state
                needs = final is RunState.SUCCEEDED and reduce is not None
                needs = needs and reduces(run.template)
                if not needs or reduced is not None:
                    return self._settle(conn, run, final, reduced, released, ended)
                results = child_results(conn, run_id)
            assert reduce is not None
            try:  # the lock is released: the user's reduce runs outside it
                reduced = (run.dispatches, reduce(run, lambda: results), None)
            except UnknownTemplate:
                return run.state
            except DtaskError as exc:
                reduced = (run.dispatches, None, str(exc))

    def _settle(
        self,
        conn: Connection,
        run: RunRecord,
        final: RunState,
        reduced: Reduced | None,
        released: list[int] | None,
        ended: list[str] | None,
    ) -> RunState:
        error = self._failure_summary(conn, run.id) if final is RunState.FAILED else None
        result = None
        if reduced is not None:
            dispatch, result, failed = reduced
            if dispatch != run.dispatches:
                return run.state  # reduced for another dispatch (a rerun): not ours
            if failed is not None:
                final, error = RunState.FAILED, failed
        # a rerun's run is splitting: its own chord finalizes it, not this late callback
        settled = self._set_run_state(conn, run.id, final, error=error, result=result)
        if settled is None:
            return run.state
        if released is not None:
            released.extend(settled)
        if ended is not None and run.group_id is not None:
            ended.append(run.group_id)
        return final

    @staticmethod
    def _set_run_state(
        conn: Connection,
        run_id: int,
        state: RunState,
        error: str | None = None,
        result: str | None = None,
    ) -> list[int] | None:
        """None if the run could not move to ``state``; else the dependents that released
        (see :func:`deps.settle`)."""
        finished = "now()" if state.finished else "NULL"
        changed = conn.execute(
            sql(
                # a run of a concurrency key goes back to pending (a rerun) through its
                # key's admission: waiting until that admits it
                "UPDATE dtask_runs SET state = CASE WHEN CAST(:state AS text) = 'pending'"
                "   AND concurrency_key IS NOT NULL THEN 'waiting' ELSE CAST(:state AS text) END,"
                f" error = :error, finished_at = {finished},"
                " result = CAST(:result AS jsonb), updated_at = now()"
                " WHERE id = :id AND state = ANY(:sources) RETURNING client, concurrency_key"
            ),
            {
                "id": run_id,
                "state": state.value,
                "error": error,
                "result": result,
                "sources": sources(state),
            },
        ).first()
        if changed is None:
            return None
        key = concurrency.key_of(changed)
        if state.finished:
            return deps.settle(conn, run_id, state, key)
        if state is RunState.PENDING and key is not None:
            return concurrency.admit(conn, [key])
        return []

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
