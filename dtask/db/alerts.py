"""Alerts in PostgreSQL: the facts the monitor judges, and the open alerts it keeps in step.

One monitor pass at a time in the whole cluster (an advisory lock): whoever opens or closes an
alert is the only one to log and post it, so each is reported once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from dtask.db.database import Database, sql
from dtask.domain.alerts import (
    Alert,
    AlertKind,
    Facts,
    LossFact,
    RunFact,
    ScheduleFact,
    Scope,
    WorkerFact,
    kinds_of,
)
from dtask.exceptions import LeaseLost

MONITOR_LOCK = 0x64746E
HOLD = 10.0  # seconds the monitor's turn may sit idle (its statements take milliseconds)
_UNFINISHED = "('pending', 'splitting', 'running')"


@dataclass(frozen=True)
class OpenAlert:
    id: int
    kind: str
    subject: str
    message: str
    opened_at: datetime
    closed_at: datetime | None = None

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "kind": self.kind,
            "subject": self.subject,
            "message": self.message,
            "opened_at": self.opened_at.isoformat(),
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
        }


@dataclass(frozen=True)
class Changes:
    opened: list[OpenAlert]
    closed: list[OpenAlert]


class AlertStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def judge(
        self,
        forget_workers_after: float,
        holding: Callable[[Facts], list[Alert]],
        stalled_after: float,
    ) -> Changes | None:
        """One monitor pass, if no other monitor is in one: read the facts, keep the open
        alerts in step with ``holding(facts)``. None when another monitor holds the turn (it
        reads nothing: the facts read unfinished runs' children). A run's quiet time is
        exact where it exceeds ``stalled_after``, capped below it otherwise (see _facts)."""
        with self._turn_held() as conn:
            if not _turn(conn):
                return None
            return _sync(conn, holding(_facts(conn, forget_workers_after, stalled_after)))

    def sync(self, holding: list[Alert]) -> Changes | None:
        """Open the alerts in ``holding`` not open yet, refresh the messages of those still
        holding, close the others. None if another monitor is in a pass."""
        with self._turn_held() as conn:
            if not _turn(conn):
                return None
            return _sync(conn, holding)

    def _turn_held(self) -> AbstractContextManager[Connection]:
        """The monitor's turn, lost once it sits idle HOLD seconds (a frozen monitor stops no
        other monitor for longer)."""
        return self.db.held(HOLD, LeaseLost("the monitor's turn ended: held past its limit"))

    def open(self, client: str | None = None) -> list[OpenAlert]:
        """The open alerts, oldest first: every one (None: an admin's view), or those a token
        of ``client`` sees (:data:`dtask.domain.alerts.SCOPES`): the cluster's, and those
        about runs of ``client``; never another client's run, nor a schedule."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT a.id, a.kind, a.subject, a.message, a.opened_at FROM dtask_alerts a"
                    " WHERE a.closed_at IS NULL AND (CAST(:client AS text) IS NULL"
                    "   OR a.kind = ANY(CAST(:cluster AS text[]))"
                    "   OR (a.kind = ANY(CAST(:about_runs AS text[])) AND EXISTS (SELECT 1"
                    "     FROM dtask_runs r WHERE r.client = CAST(:client AS text)"
                    "     AND r.id = CAST(CASE WHEN a.subject ~ '^[0-9]{1,18}$'"
                    "       THEN a.subject END AS bigint))))"
                    " ORDER BY a.opened_at, a.id"
                ),
                {
                    "client": client,
                    "cluster": kinds_of(Scope.CLUSTER),
                    "about_runs": kinds_of(Scope.RUN),
                },
            ).all()
        return [OpenAlert(*r) for r in rows]

    def open_counts(self) -> dict[str, int]:
        """Open alerts by kind, every kind named (for /metrics)."""
        counts = {k.value: 0 for k in AlertKind}
        with self.db.tx() as conn:
            for kind, n in conn.execute(
                sql("SELECT kind, count(*) FROM dtask_alerts WHERE closed_at IS NULL GROUP BY kind")
            ).all():
                counts[kind] = int(n)
        return counts


def _turn(conn: Connection) -> bool:
    took = conn.execute(sql("SELECT pg_try_advisory_xact_lock(:key)"), {"key": MONITOR_LOCK})
    return bool(took.scalar())


def _facts(conn: Connection, forget_workers_after: float, stalled_after: float) -> Facts:
    conn.execute(
        sql("DELETE FROM dtask_workers WHERE seen_at < now() - make_interval(secs => :forget)"),
        {"forget": forget_workers_after},
    )
    workers = conn.execute(
        sql(
            "SELECT name, busy, extract(epoch FROM now() - seen_at) AS seen_ago,"
            " extract(epoch FROM now() - idle_since) AS idle_for FROM dtask_workers"
        )
    ).all()
    # A run whose running child was taken or wrote within ``stalled_after`` is not stalled,
    # however much more recent its last change: that child's time (through the lease index)
    # answers without reading every child's updated_at, a scan of a million-child run every
    # two seconds
    runs = conn.execute(
        sql(
            "SELECT r.id, r.template, extract(epoch FROM now() - greatest("
            "   r.updated_at, r.started_at, r.created_at, busy.at,"
            # or whose message was taken (its children are written as each one ends)
            "   (SELECT max(m.claimed_at) FROM dtask_messages m WHERE m.run_id = r.id"
            "     AND m.owner IS NOT NULL),"
            "   CASE WHEN busy.at > now() - make_interval(secs => :stalled) THEN NULL ELSE"
            "   (SELECT max(c.updated_at) FROM dtask_children c WHERE c.run_id = r.id) END"
            " )) AS quiet_for,"
            " CASE WHEN r.deadline < now() AND r.late IS NULL"
            "   THEN extract(epoch FROM now() - r.deadline) END AS late_by"
            " FROM dtask_runs r LEFT JOIN LATERAL (SELECT max(c.updated_at) AS at"
            "   FROM dtask_children c WHERE c.run_id = r.id AND c.state = 'running'"
            "   AND c.lease_expires_at IS NOT NULL) busy ON true"
            f" WHERE r.state IN {_UNFINISHED}"
        ),
        {"stalled": stalled_after},
    ).all()
    schedules = conn.execute(
        sql(
            "SELECT name, last_error, misfire_note,"
            " extract(epoch FROM now() - misfired_at) AS misfired_ago"
            " FROM dtask_schedules"
            " WHERE enabled AND (last_error IS NOT NULL OR misfired_at IS NOT NULL)"
        )
    ).all()
    losses = conn.execute(
        sql(
            "SELECT queue, missing, resent, extract(epoch FROM now() - found_at) AS found_ago"
            " FROM dtask_lost_messages"
        )
    ).all()
    return Facts(
        tuple(
            WorkerFact(
                w.name,
                float(w.seen_ago),
                int(w.busy),
                None if w.idle_for is None else float(w.idle_for),
            )
            for w in workers
        ),
        tuple(
            RunFact(
                r.id,
                r.template,
                float(r.quiet_for),
                None if r.late_by is None else float(r.late_by),
            )
            for r in runs
        ),
        tuple(
            ScheduleFact(
                s.name,
                s.last_error,
                s.misfire_note,
                None if s.misfired_ago is None else float(s.misfired_ago),
            )
            for s in schedules
        ),
        tuple(LossFact(x.queue, x.missing, x.resent, float(x.found_ago)) for x in losses),
    )


def _sync(conn: Connection, holding: list[Alert]) -> Changes:
    rows = conn.execute(
        sql(
            "SELECT id, kind, subject, message, opened_at FROM dtask_alerts WHERE closed_at IS NULL"
        )
    ).all()
    current = {(r.kind, r.subject): OpenAlert(*r) for r in rows}
    wanted = {a.key: a for a in holding}
    closed = [
        OpenAlert(*r)
        for r in conn.execute(
            sql(
                "UPDATE dtask_alerts SET closed_at = now()"
                " WHERE id = ANY(:ids) RETURNING id, kind, subject, message,"
                " opened_at, closed_at"
            ),
            {"ids": [a.id for k, a in current.items() if k not in wanted]},
        ).all()
    ]
    opened = []
    for key, alert in wanted.items():
        if key in current:
            if current[key].message != alert.message:
                conn.execute(
                    sql("UPDATE dtask_alerts SET message = :message WHERE id = :id"),
                    {"message": alert.message, "id": current[key].id},
                )
            continue
        row = conn.execute(
            sql(
                "INSERT INTO dtask_alerts (kind, subject, message)"
                " VALUES (:kind, :subject, :message)"
                " RETURNING id, kind, subject, message, opened_at"
            ),
            {"kind": alert.kind.value, "subject": alert.subject, "message": alert.message},
        ).one()
        opened.append(OpenAlert(*row))
    return Changes(opened, closed)
