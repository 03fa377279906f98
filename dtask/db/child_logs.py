"""Children's output as `dtask logs` and the API read it: a child's attempts, or a run's
children that printed, optionally only what changed since a moment (``--follow``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from dtask.db.database import Database, sql
from dtask.domain.logs import AttemptLog, ChildNow, attempts
from dtask.domain.runs import ChildState

_CHILD = (
    "SELECT index, state, attempt, coalesce(owner, worker) AS worker, output, error,"
    " coalesce(finished_at, updated_at) AS at FROM dtask_children"
)
_LOGGED = (
    "SELECT index, attempt, worker, state, output, skipped, error, updated_at AS at"
    " FROM dtask_child_logs"
)


class ChildLogs:
    def __init__(self, db: Database) -> None:
        self.db = db

    def of_child(self, run_id: int, index: int) -> tuple[list[AttemptLog], datetime] | None:
        """The child's attempts in order, and PostgreSQL's time of the read; None: no such
        child."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(f"{_CHILD} WHERE run_id = :run AND index = :index"),
                {"run": run_id, "index": index},
            ).first()
            if row is None:
                return None
            logged = conn.execute(
                sql(f"{_LOGGED} WHERE run_id = :run AND index = :index ORDER BY attempt"),
                {"run": run_id, "index": index},
            ).all()
            return attempts(_now(row), map(_logged, logged)), _clock(conn)

    def of_run(
        self, run_id: int, since: datetime | None, limit: int
    ) -> tuple[list[AttemptLog], datetime]:
        """The attempts of the run's children that printed (or failed), in child and attempt
        order, of at most ``limit`` children, those written after ``since`` where given; and
        PostgreSQL's time of the read (the next ``since``)."""
        with self.db.tx() as conn:
            now = _clock(conn)
            after = since or datetime.min.replace(tzinfo=now.tzinfo)
            logged = conn.execute(
                sql(f"{_LOGGED} WHERE run_id = :run AND updated_at > :since"),
                {"run": run_id, "since": after},
            ).all()
            finished = conn.execute(
                sql(
                    f"{_CHILD} WHERE run_id = :run AND (output IS NOT NULL OR error IS NOT NULL)"
                    " AND state IN ('succeeded', 'failed')"
                    " AND coalesce(finished_at, updated_at) > :since"
                ),
                {"run": run_id, "since": after},
            ).all()
            indexes = sorted({_ix(r) for r in logged} | {_ix(r) for r in finished})[:limit]
            children = {_ix(r): _now(r) for r in finished}
            missing = [i for i in indexes if i not in children]
            if missing:
                rows = conn.execute(
                    sql(f"{_CHILD} WHERE run_id = :run AND index = ANY(:ix)"),
                    {"run": run_id, "ix": missing},
                ).all()
                children.update((_ix(r), _now(r)) for r in rows)
        by_child: dict[int, list[AttemptLog]] = {}
        for r in logged:
            by_child.setdefault(_ix(r), []).append(_logged(r))
        found = [
            a
            for i in indexes
            if i in children
            for a in attempts(children[i], by_child.get(i, []))
            if since is None or a.at is None or a.at > since
        ]
        return found, now


def _clock(conn: Connection) -> datetime:
    moment: datetime = conn.execute(sql("SELECT now()")).scalar_one()
    return moment


def _ix(r: Row[Any]) -> int:
    return int(r._mapping["index"])  # a Row's .index is the tuple's method


def _now(r: Row[Any]) -> ChildNow:
    return ChildNow(
        r._mapping["index"], ChildState(r.state), r.attempt, r.worker, r.output, r.error, r.at
    )


def _logged(r: Row[Any]) -> AttemptLog:
    return AttemptLog(
        r._mapping["index"], r.attempt, r.worker, r.state, r.output, r.skipped, r.error, r.at
    )
