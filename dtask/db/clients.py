"""Clients: their limits, and the rate check each submit passes in its own transaction.

A limited client's submits queue on its row lock (``FOR UPDATE``), so the window count and the
insert are one step across any number of processes and machines: the limit is exact."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row

from dtask.db.database import Database, sql
from dtask.db.queued import HELD
from dtask.domain.clients import DEFAULT_CLIENT, Client, Rate, refusal, retry_after, tier_of
from dtask.exceptions import ClientNotFound

CLIENT_COLUMNS = (
    "name, rate_count, rate_period, child_rate_count, child_rate_period, max_running, weight,"
    " tier, max_priority"
)


def client_from_row(row: Row[Any]) -> Client:
    return Client(
        name=row.name,
        rate=None if row.rate_count is None else Rate(row.rate_count, row.rate_period),
        child_rate=(
            None
            if row.child_rate_count is None
            else Rate(row.child_rate_count, row.child_rate_period)
        ),
        max_running=row.max_running,
        weight=row.weight,
        tier=None if row.tier is None else tier_of(row.tier),
        max_priority=row.max_priority,
    )


def lock_client(conn: Connection, name: str) -> tuple[Client, bool]:
    """The client a new run is charged to, its row locked until the transaction ends: a
    limited client's submits pass :func:`check_rates` one at a time; and whether it has a row
    (``default`` may have none)."""
    row = conn.execute(
        sql(f"SELECT {CLIENT_COLUMNS} FROM dtask_clients WHERE name = :name FOR UPDATE"),
        {"name": name},
    ).first()
    return _client_or_default(row, name), row is not None


def _client_or_default(row: Row[Any] | None, name: str) -> Client:
    """The client of ``row``; without a row only ``default`` exists (with no limits)."""
    if row is not None:
        return client_from_row(row)
    if name != DEFAULT_CLIENT:
        raise _missing(name)
    return Client(DEFAULT_CLIENT)


def check_rates(conn: Connection, client: Client, children: int | None) -> None:
    """Raise RateLimited unless one more run of ``children`` children fits the client's rates.

    ``children``: what the run will split into, if its split can count before splitting;
    otherwise it costs 1 now and its real count once split."""
    for limit, what, cost in (
        (client.rate, "runs", 1),
        (client.child_rate, "children", max(1, children or 1)),
    ):
        if limit is None:
            continue
        window, now = rate_window(conn, client.name, limit, what)
        wait = retry_after(window, limit, cost, now)
        if wait is not None:
            raise refusal(limit, what, cost, wait, client.name)


def rate_window(
    conn: Connection, client: str, limit: Rate, what: str
) -> tuple[list[tuple[datetime, int]], datetime]:
    """What the client's window of ``limit`` (over "runs" or "children") holds, oldest first:
    (accepted at, cost); and the database's time now."""
    rows = conn.execute(
        sql(
            "SELECT created_at AS at, CASE WHEN :runs THEN 1"
            "   ELSE coalesce(child_total, expected_children, 1) END AS cost,"
            " clock_timestamp() AS now"
            " FROM dtask_runs WHERE client = :name"
            "   AND created_at > clock_timestamp() - make_interval(secs => :period)"
            " ORDER BY created_at"
        ),
        {"name": client, "period": limit.seconds, "runs": what == "runs"},
    ).all()
    now = rows[0].now if rows else datetime.now(UTC)  # an empty window: unused
    return [(r.at, int(r.cost)) for r in rows], now


def _missing(name: str) -> ClientNotFound:
    return ClientNotFound(
        f"no client named {name!r}; create it with `dtask client set {name}`"
        " (or submit as the client 'default')"
    )


class ClientStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, name: str) -> Client:
        with self.db.tx() as conn:
            row = conn.execute(
                sql(f"SELECT {CLIENT_COLUMNS} FROM dtask_clients WHERE name = :name"),
                {"name": name},
            ).first()
            client = _client_or_default(row, name)
            return Client(**{**vars(client), "usage": self._usage(conn, client)})

    def list(self, usage: bool = False) -> list[Client]:
        """Every client (``default`` always), with what each uses now if ``usage``."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(f"SELECT {CLIENT_COLUMNS} FROM dtask_clients ORDER BY name")
            ).all()
            clients = [client_from_row(r) for r in rows]
            if all(c.name != DEFAULT_CLIENT for c in clients):
                clients.insert(0, Client(DEFAULT_CLIENT))
            if usage:
                clients = [Client(**{**vars(c), "usage": self._usage(conn, c)}) for c in clients]
        return clients

    def save(self, client: Client) -> None:
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    f"INSERT INTO dtask_clients ({CLIENT_COLUMNS}) VALUES (:name, :rate_count,"
                    " :rate_period, :child_rate_count, :child_rate_period, :max_running,"
                    " :weight, :tier, :max_priority)"
                    " ON CONFLICT (name) DO UPDATE SET rate_count = excluded.rate_count,"
                    " rate_period = excluded.rate_period,"
                    " child_rate_count = excluded.child_rate_count,"
                    " child_rate_period = excluded.child_rate_period,"
                    " max_running = excluded.max_running, weight = excluded.weight,"
                    " tier = excluded.tier, max_priority = excluded.max_priority,"
                    " updated_at = now()"
                ),
                {
                    "name": client.name,
                    "rate_count": client.rate and client.rate.count,
                    "rate_period": client.rate and client.rate.period,
                    "child_rate_count": client.child_rate and client.child_rate.count,
                    "child_rate_period": client.child_rate and client.child_rate.period,
                    "max_running": client.max_running,
                    "weight": client.weight,
                    "tier": client.tier and client.tier.value,
                    "max_priority": client.max_priority,
                },
            )

    def remove(self, name: str) -> None:
        """Remove a client's limits. Its runs keep its name; new submits as it are refused."""
        with self.db.tx() as conn:
            gone = conn.execute(
                sql("DELETE FROM dtask_clients WHERE name = :name"), {"name": name}
            ).rowcount
        if not gone:
            raise _missing(name)

    @staticmethod
    def _usage(conn: Connection, client: Client) -> dict[str, int]:
        """What the client uses now: active runs, running children, and each rate's window."""
        row = conn.execute(
            sql(
                "SELECT"
                " (SELECT count(*) FROM dtask_runs WHERE client = :name"
                "   AND state IN ('pending', 'splitting', 'running')) AS active_runs,"
                " (SELECT count(*) FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                "   WHERE r.client = :name AND r.state = 'running' AND c.state = 'running')"
                f" + (SELECT coalesce(sum(h.n), 0) FROM ({HELD}) h JOIN dtask_runs r"
                "   ON r.id = h.run_id WHERE r.client = :name AND r.state = 'running')"
                "   AS running_children,"
                " (SELECT count(*) FROM dtask_runs WHERE client = :name"
                "   AND created_at > now() - make_interval(secs => :rate)) AS runs_in_window,"
                " (SELECT coalesce(sum(coalesce(child_total, expected_children, 1)), 0)"
                "   FROM dtask_runs WHERE client = :name"
                "   AND created_at > now() - make_interval(secs => :child_rate))"
                "   AS children_in_window"
            ),
            {
                "name": client.name,
                "rate": client.rate.seconds if client.rate else 0,
                "child_rate": client.child_rate.seconds if client.child_rate else 0,
            },
        ).one()
        usage = {"active_runs": row.active_runs, "running_children": row.running_children}
        if client.rate:
            usage["runs_in_window"] = row.runs_in_window
        if client.child_rate:
            usage["children_in_window"] = int(row.children_in_window)
        return usage
