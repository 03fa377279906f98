"""The facts behind "why it waits" (dtask/domain/waiting.py), read in one transaction from
what the dispatcher reads: the run, its children left, its unfinished upstreams, the live
workers, its client's cap and the other runs of its queue. A few indexed statements, each
bounded by what is out or waiting, not by the run's size (the status beside it counts that)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import Connection

from dtask.db.concurrency import holding
from dtask.db.database import Database, sql
from dtask.db.dispatch import out_rows
from dtask.db.queued import HELD, QUEUED, held, unsent
from dtask.db.workers import WorkerInfo, live_on
from dtask.domain.runs import RunState
from dtask.domain.tiers import DEFAULT_QUEUE
from dtask.domain.waiting import SHOWN, Facts, KeyFacts, Upstream, Worker
from dtask.exceptions import RunNotFound


class WaitingReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    def facts(self, run_id: int, within: float) -> tuple[Facts, list[WorkerInfo]]:
        """The run's facts, and the live workers (seen within ``within`` seconds) they name:
        the caller adds what each one's code files say (``Worker.changed``)."""
        with self.db.tx() as conn:
            run = conn.execute(
                sql(
                    "SELECT id, state, template, queue, client, priority, start_after, unsent,"
                    " sent_through,"
                    " concurrency_key, max_concurrent, now() AS now FROM dtask_runs WHERE id = :id"
                ),
                {"id": run_id},
            ).first()
            if run is None:
                raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
            state = RunState(run.state)
            workers = live_on(conn, within)
            facts = Facts(
                run_id=run.id,
                state=state,
                template=run.template,
                queue=run.queue or DEFAULT_QUEUE,
                client=run.client,
                priority=run.priority,
                now=run.now,
                start_after=run.start_after,
                unsent=run.unsent,
                workers=[Worker(w.name, w.queues, w.slots, w.busy, w.templates) for w in workers],
            )
            if state is RunState.WAITING:
                key = run.concurrency_key and _key(conn, run)
                return replace(facts, upstreams=_upstreams(conn, run_id), key=key), workers
            if state not in (RunState.PENDING, RunState.RUNNING):
                return facts, workers
            left = conn.execute(
                sql(
                    "SELECT c.running + h.n AS running, c.queued - h.n AS queued FROM"
                    " (SELECT count(*) FILTER (WHERE state = 'running') AS running,"
                    " count(*) FILTER (WHERE state = 'pending')"
                    f" - count(*) FILTER (WHERE {unsent(':mark')}) AS queued FROM dtask_children"
                    " WHERE run_id = :id AND state IN ('pending', 'running')) c,"
                    f" (SELECT {held(':id')} AS n) h"
                ),
                {"id": run_id, "mark": run.sent_through},
            ).one()
            # the queue's children not yet taken, per run: waiting in PostgreSQL, or sent
            queue = conn.execute(
                sql(
                    "WITH waiting AS ("
                    " SELECT id, priority, unsent AS n FROM dtask_runs"
                    "  WHERE unsent > 0 AND state = 'running' AND coalesce(queue, '') = :q"
                    " UNION ALL"
                    f" SELECT r.id, r.priority, q.n FROM ({QUEUED}) q"
                    "  JOIN dtask_runs r ON r.id = q.run_id"
                    "  WHERE r.state = 'running' AND coalesce(r.queue, '') = :q)"
                    " SELECT coalesce(sum(n) FILTER (WHERE priority > :p), 0) AS higher,"
                    " count(DISTINCT id) FILTER (WHERE id <> :id) AS others,"
                    " (SELECT count(*) FROM dtask_children c JOIN dtask_runs r"
                    "   ON r.id = c.run_id WHERE c.state = 'running'"
                    "   AND c.lease_expires_at IS NOT NULL"
                    "   AND coalesce(r.queue, '') = :q)"
                    f" + (SELECT coalesce(sum(h.n), 0) FROM ({HELD}) h JOIN dtask_runs r"
                    "   ON r.id = h.run_id WHERE coalesce(r.queue, '') = :q) AS running"
                    " FROM waiting"
                ),
                {"p": run.priority, "id": run_id, "q": run.queue or ""},
            ).one()
            cap = conn.execute(
                sql("SELECT max_running FROM dtask_clients WHERE name = :c"), {"c": run.client}
            ).scalar()
            return (
                replace(
                    facts,
                    running=left.running,
                    queued=left.queued,
                    higher=int(queue.higher),
                    others=queue.others,
                    queue_running=queue.running,
                    max_running=cap,
                    client_out=0 if cap is None else _client_out(conn, run.client),
                ),
                workers,
            )


def _key(conn: Connection, run: Any) -> KeyFacts:
    unfinished, holders = holding(conn, (run.client, run.concurrency_key))
    ahead = conn.execute(
        sql(
            "SELECT count(*) FROM dtask_runs WHERE client = :client AND concurrency_key = :key"
            " AND state = 'waiting' AND id < :id"
        ),
        {"client": run.client, "key": run.concurrency_key, "id": run.id},
    ).scalar_one()
    return KeyFacts(run.concurrency_key, run.max_concurrent, unfinished, holders, ahead)


def _upstreams(conn: Connection, run_id: int) -> list[Upstream]:
    """Its unfinished upstreams, the first SHOWN with their progress (the rest only named:
    progress costs a count of each one's children)."""
    rows = conn.execute(
        sql(
            "SELECT u.id, u.state, coalesce(u.child_total, 0) AS total"
            " FROM dtask_run_deps d JOIN dtask_runs u ON u.id = d.upstream_id"
            " WHERE d.run_id = :id AND u.state NOT IN ('succeeded', 'failed', 'cancelled')"
            " ORDER BY u.id"
        ),
        {"id": run_id},
    ).all()
    finished: dict[int, int] = dict(
        conn.execute(
            sql(
                "SELECT run_id, count(*) FROM dtask_children WHERE run_id = ANY(:ids)"
                " AND state IN ('succeeded', 'failed') GROUP BY run_id"
            ),
            {"ids": [r.id for r in rows[:SHOWN]]},
        ).all()
    )
    return [Upstream(r.id, RunState(r.state), finished.get(r.id, 0), r.total) for r in rows]


def _client_out(conn: Connection, client: str) -> int:
    """The client's children running, or sent and not yet taken, as the dispatcher counts
    them against its cap."""
    return sum(r.queued + r.running for r in out_rows(conn, client))
