"""Cluster-wide counters for /metrics, kept in PostgreSQL so every API instance reports the same
totals whichever process counted. Only rare events are counted here (lease expiries,
refusals, schedule slots): hot paths are read from the runs' own rows at scrape time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sqlalchemy import Connection

from dtask.db.database import Database, sql

LEASE_EXPIRIES: Final = "lease_expiries"
REDISPATCHED: Final = "children_redispatched"
RATE_LIMITED: Final = "rate_limit_refusals"  # label: the client
SLOTS_FIRED: Final = "schedule_slots_fired"  # label: the schedule
SLOTS_MISSED: Final = "schedule_slots_missed"  # label: the schedule
FAILOVER: Final = "failover_seconds"  # a histogram: labels le=<bound>, sum, count
FAILOVER_BUCKETS: Final = (1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)

_ADD = sql(
    "INSERT INTO dtask_counters (name, label, value) VALUES (:name, :label, :value)"
    " ON CONFLICT (name, label) DO UPDATE SET value = dtask_counters.value + excluded.value"
)


def add(conn: Connection, name: str, value: float = 1.0, label: str = "") -> None:
    """Add to a counter inside the caller's transaction (counted only if it commits)."""
    if value:
        conn.execute(_ADD, {"name": name, "label": label, "value": value})


def observe_failovers(conn: Connection, seconds: Iterable[float]) -> None:
    """Record failover times in the histogram (cumulative buckets, as Prometheus has them)."""
    seen = list(seconds)
    if not seen:
        return
    rows = [{"name": FAILOVER, "label": "count", "value": float(len(seen))}]
    rows.append({"name": FAILOVER, "label": "sum", "value": sum(seen)})
    for bound in FAILOVER_BUCKETS:
        within = sum(1 for s in seen if s <= bound)
        if within:
            rows.append({"name": FAILOVER, "label": f"le={bound:g}", "value": float(within)})
    conn.execute(_ADD, rows)


class CounterStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, name: str, value: float = 1.0, label: str = "") -> None:
        with self.db.tx() as conn:
            add(conn, name, value, label)

    def all(self) -> dict[str, dict[str, float]]:
        """{name: {label: value}}."""
        found: dict[str, dict[str, float]] = {}
        with self.db.tx() as conn:
            for name, label, value in conn.execute(
                sql("SELECT name, label, value FROM dtask_counters")
            ).all():
                found.setdefault(name, {})[label] = float(value)
        return found
