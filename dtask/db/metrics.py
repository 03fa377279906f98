"""What /metrics reports, read from PostgreSQL at scrape time: every API instance answers the
same for the whole cluster, whichever process did the work."""

from __future__ import annotations

from dataclasses import dataclass, field

from dtask.db.alerts import AlertStore
from dtask.db.counters import CounterStore
from dtask.db.database import Database, sql
from dtask.db.queued import HELD, as_running
from dtask.domain.tiers import DEFAULT_QUEUE


@dataclass
class Snapshot:
    runs: dict[str, int] = field(default_factory=dict)  # by state
    children: dict[str, int] = field(default_factory=dict)  # by state
    attempts: int = 0  # child starts, retries and failovers included
    lag: list[tuple[str, str, float]] = field(default_factory=list)  # queue, client, seconds
    workers: list[tuple[str, int, int]] = field(default_factory=list)  # name, slots, busy
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    alerts: dict[str, int] = field(default_factory=dict)  # open, by kind


class MetricsStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def snapshot(self, live_within: float) -> Snapshot:
        found = Snapshot()
        with self.db.tx() as conn:
            for state, n in conn.execute(
                sql("SELECT state, count(*) FROM dtask_runs GROUP BY state")
            ).all():
                found.runs[state] = int(n)
            for state, n, tries in conn.execute(
                sql("SELECT state, count(*), sum(attempt) FROM dtask_children GROUP BY state")
            ).all():
                found.children[state] = int(n)
                found.attempts += int(tries or 0)
            held = conn.execute(sql(f"SELECT coalesce(sum(n), 0) FROM ({HELD}) h")).scalar_one()
            as_running(found.children, int(held))
            found.lag = [
                (r.queue or DEFAULT_QUEUE, r.client, float(r.lag))
                for r in conn.execute(
                    sql(
                        "SELECT queue, client, extract(epoch FROM"
                        "   max(now() - coalesce(started_at, created_at))) AS lag"
                        " FROM dtask_runs WHERE state = 'running' AND unsent > 0"
                        " GROUP BY queue, client"
                    )
                ).all()
            ]
            found.workers = [
                (r.name, int(r.slots), int(r.busy))
                for r in conn.execute(
                    sql(
                        "SELECT name, slots, busy FROM dtask_workers"
                        " WHERE seen_at >= now() - make_interval(secs => :within)"
                    ),
                    {"within": live_within},
                ).all()
            ]
        found.counters = CounterStore(self.db).all()
        found.alerts = AlertStore(self.db).open_counts()
        return found
