"""Creating runs: once per trigger key, charged to a client, pending or waiting for the runs
it was submitted after (see :mod:`dtask.db.deps`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from dtask.db import counters, deps
from dtask.db.clients import check_rates, lock_client
from dtask.db.database import Database, sql
from dtask.db.run_reads import RunReads
from dtask.domain.clients import DEFAULT_CLIENT, DEFAULT_PRIORITY, Tier
from dtask.domain.deadlines import OnLate
from dtask.domain.runs import RunState
from dtask.domain.tiers import tier_queue
from dtask.exceptions import KeyConflict, RateLimited


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
    after: tuple[int, ...] = ()  # upstream runs: it waits for them to succeed
    unmet: str | None = None  # why it fails at once (a schedule's upstream slot never ran)


_START = (
    "coalesce(CAST(:start_at AS timestamptz),"
    " clock_timestamp() + make_interval(secs => CAST(:start_in AS double precision)))"
)


def insert_run(conn: Connection, run: NewRun) -> int | None:
    """Insert a run unless its trigger key exists (exactly once per key): its id, or None when
    the key was taken. It is pending, or waiting for its unfinished upstreams, or failed at
    once when one of them failed or was cancelled."""
    state, error = deps.initial_state(conn, run.after)
    if run.unmet is not None:
        state, error = RunState.FAILED, run.unmet
    row = conn.execute(
        sql(
            "INSERT INTO dtask_runs"
            " (template, trigger_key, variables, max_attempts, queue, schedule, slot,"
            " execution_cap, client, priority, expected_children, created_at,"
            " delay_tolerance, on_late, deadline, tier, notify_url, notify_state, start_after,"
            " state, error, finished_at)"
            " VALUES (:template, :key, CAST(:variables AS jsonb), :max_attempts, :queue,"
            " :schedule, :slot, :execution_cap, :client, :priority, :expected_children,"
            " clock_timestamp(), :delay_tolerance, :on_late,"
            " coalesce(:slot, " + _START + ", clock_timestamp())"
            " + make_interval(secs => :delay_tolerance),"
            " :tier, CAST(:notify_url AS text),"
            " CASE WHEN CAST(:notify_url AS text) IS NULL THEN NULL ELSE 'waiting' END,"
            " " + _START + ", CAST(:state AS text), CAST(:error AS text),"
            " CASE WHEN CAST(:state AS text) = 'failed' THEN clock_timestamp() END)"
            " ON CONFLICT (trigger_key) DO NOTHING RETURNING id"
        ),
        {
            **asdict(run),
            "variables": json.dumps(run.variables),
            "on_late": run.on_late.value,
            "tier": run.tier.value,
            "state": state.value,
            "error": error,
        },
    ).first()
    if row is None:
        return None
    deps.insert(conn, int(row.id), run.after)
    return int(row.id)


class RunInserts(RunReads):
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
        after: Sequence[int] = (),
    ) -> tuple[int, bool]:
        """Insert a run for ``key`` unless one exists. Returns (run id, created).

        A new run is charged to ``client`` (RateLimited when its rate limits refuse it); a
        known key returns its run and costs nothing. Its children go to the queue of the
        tier it gets (``tier``, capped by the client's). With ``after`` (existing runs'
        ids; UpstreamNotFound otherwise) it waits for them (see :mod:`dtask.db.deps`)."""
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
                        after=tuple(after),
                    )  # fmt: skip
                    created = insert_run(conn, new)
                    if created is not None:
                        return created, True
                    existing = self._by_key(conn, key)
                assert existing is not None
                existing_after = deps.upstreams_of(conn, existing.id)
        except RateLimited:  # counted once its transaction is rolled back
            self.counters.add(counters.RATE_LIMITED, label=client)
            raise
        differs = [
            what
            for what, same in (
                ("template", existing.template == template),
                ("variables", existing.variables == variables),
                ("upstream runs (after)", existing_after == sorted(set(after))),
            )
            if not same
        ]
        if differs:  # its variables are not shown: they may be another client's data
            raise KeyConflict(
                f"key {key!r} already triggered run {existing.id} with another"
                f" {' and '.join(differs)}; use another key for another run"
            )
        return int(existing.id), False

    @staticmethod
    def _by_key(conn: Connection, key: str) -> Row[Any] | None:
        return conn.execute(
            sql("SELECT id, template, variables FROM dtask_runs WHERE trigger_key = :key"),
            {"key": key},
        ).first()

    def forget_unsent(self, run_id: int) -> bool:
        """Undo create_run when its master message could not be sent (no half-created run);
        False if a run submitted after it meanwhile keeps it (the reaper starts it later)."""
        with self.db.tx() as conn:
            gone = conn.execute(
                sql(
                    "DELETE FROM dtask_runs WHERE id = :id AND state = 'pending' AND NOT EXISTS"
                    " (SELECT 1 FROM dtask_run_deps WHERE upstream_id = :id)"
                ),
                {"id": run_id},
            )
        return gone.rowcount == 1
