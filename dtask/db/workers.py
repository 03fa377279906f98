"""Workers: each `dtask worker` main process reports itself every reaper interval; the live
ones are those seen recently. What the dispatcher's window and `dtask workers` read."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import Connection

from dtask.db import pooler
from dtask.db.database import Database, sql
from dtask.domain.dispatch import runnable
from dtask.domain.tiers import DEFAULT_QUEUE


class ServerConnections(NamedTuple):
    most: int  # max_connections
    usable: int  # what non-superusers may use of them
    in_use: int  # client backends now
    pooled: bool  # seen through a transaction pooler: its limits, not these, bind dtask


@dataclass(frozen=True)
class WorkerInfo:
    name: str
    queues: tuple[str, ...]
    slots: int
    pid: int
    started_at: datetime
    seen_ago: float  # seconds, by PostgreSQL's clock
    busy: int = 0  # children running on it at its last report
    idle_for: float | None = None  # seconds without a child; None while busy
    templates: tuple[str, ...] | None = None  # the templates it can run (None: not reported)
    code: dict[str, int] | None = None  # its templates' module files: path -> mtime (ns)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "queues": list(self.queues),
            "slots": self.slots,
            "pid": self.pid,
            "started_at": self.started_at.isoformat(),
            "seen_ago": round(self.seen_ago, 1),
            "busy": self.busy,
            "idle_for": None if self.idle_for is None else round(self.idle_for, 1),
            "templates": None if self.templates is None else list(self.templates),
        }


class WorkerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def report(
        self,
        name: str,
        queues: Sequence[str],
        slots: int,
        pid: int,
        busy: int,
        templates: Sequence[str] | None = None,
        code: dict[str, int] | None = None,
    ) -> None:
        """This worker is alive, consumes ``queues``, runs up to ``slots`` children of
        ``templates`` (from the files in ``code``) and is running ``busy`` now. Rows of
        workers that stopped reporting stay (the monitor's `worker_lost` alert) until the
        monitor forgets them."""
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "INSERT INTO dtask_workers"
                    " (name, queues, slots, pid, busy, idle_since, templates, code)"
                    " VALUES (:name, :queues, :slots, :pid, :busy,"
                    "   CASE WHEN :busy > 0 THEN NULL ELSE now() END, :templates,"
                    "   CAST(:code AS jsonb))"
                    " ON CONFLICT (name) DO UPDATE SET queues = excluded.queues,"
                    " templates = excluded.templates, code = excluded.code,"
                    " slots = excluded.slots, pid = excluded.pid, seen_at = now(),"
                    " busy = excluded.busy,"
                    " idle_since = CASE WHEN excluded.busy > 0 THEN NULL"
                    "   WHEN dtask_workers.pid <> excluded.pid THEN now()"
                    "   ELSE coalesce(dtask_workers.idle_since, now()) END,"
                    " started_at = CASE WHEN dtask_workers.pid = excluded.pid"
                    "   THEN dtask_workers.started_at ELSE now() END"
                ),
                {
                    "name": name,
                    "queues": sorted(queues),
                    "slots": slots,
                    "pid": pid,
                    "busy": busy,
                    "templates": None if templates is None else sorted(templates),
                    "code": None if code is None else json.dumps(code),
                },
            )

    def leave(self, name: str) -> None:
        with self.db.tx() as conn:
            conn.execute(sql("DELETE FROM dtask_workers WHERE name = :name"), {"name": name})

    def server_connections(self) -> ServerConnections:
        """What the server allows and holds now (as seen through a pooler, if any)."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "SELECT current_setting('max_connections')::int AS most,"
                    " current_setting('superuser_reserved_connections')::int AS reserved,"
                    " (SELECT count(*) FROM pg_stat_activity"
                    "   WHERE backend_type = 'client backend') AS in_use"
                )
            ).one()
            pooled = pooler.pooled(conn.info)
        return ServerConnections(
            int(row.most), int(row.most) - int(row.reserved), int(row.in_use), pooled
        )

    def live(self, within: float) -> list[WorkerInfo]:
        """Workers seen in the last ``within`` seconds, by name (read only)."""
        with self.db.tx() as conn:
            return live_on(conn, within)


def live_on(conn: Connection, within: float) -> list[WorkerInfo]:
    """``WorkerStore.live`` on ``conn``: what the dispatcher reads inside its turn."""
    rows = conn.execute(
        sql(
            "SELECT name, queues, slots, pid, started_at,"
            " extract(epoch FROM now() - seen_at) AS seen_ago, busy,"
            " extract(epoch FROM now() - idle_since) AS idle_for, templates, code"
            " FROM dtask_workers"
            " WHERE seen_at >= now() - make_interval(secs => :within) ORDER BY name"
        ),
        {"within": within},
    ).all()
    return [
        WorkerInfo(
            r.name,
            tuple(r.queues),
            r.slots,
            r.pid,
            r.started_at,
            float(r.seen_ago),
            r.busy,
            None if r.idle_for is None else float(r.idle_for),
            None if r.templates is None else tuple(r.templates),
            r.code,
        )
        for r in rows
    ]


class LiveSlots:
    """The child slots of the live workers that would run one run's children (those that
    consume its tier's queue and can run its template), read at most once (``live``: on the
    connection of the transaction that splits it): what ``RangeSplit(parts="slots")`` asks."""

    def __init__(
        self, live: Callable[[float], list[WorkerInfo]], queue: str | None, template: str
    ) -> None:
        self._live = live
        self._queue = queue or DEFAULT_QUEUE  # the run's queue is its tier's (NewRun)
        self._template = template
        self.seen: int | None = None

    def __call__(self, within: float) -> int:
        if self.seen is None:
            self.seen = sum(
                w.slots
                for w in self._live(within)
                if self._queue in w.queues and runnable(self._template, [w.templates])
            )
        return self.seen
