"""Children as operators read them: one, a page, the grid of a run's states, an error."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Row

from dtask.db.database import Database, sql
from dtask.db.message_claims import HOLDER, SHOWN_STATE, held_ranges
from dtask.db.queued import unsent
from dtask.domain.runs import ChildState


@dataclass(frozen=True)
class ChildView:
    """One child as an operator sees it."""

    index: int
    state: ChildState
    attempt: int
    owner: str | None  # host:pid while leased
    checkpoint: Any


# A running child's attempt as people read it: a message's child taken for the first time
# counts its attempt only as it ends (``claim_many``, ``message_claims``), and is in its first
# meanwhile; one its message's claim covers is running (its row says pending)
_ATTEMPT = (
    f"CASE WHEN {SHOWN_STATE} = 'running' THEN greatest(c.attempt, 1) ELSE c.attempt END AS attempt"
)
_COLUMNS = (
    f"c.index, {SHOWN_STATE} AS state, c.spec, {_ATTEMPT}, c.max_attempts, c.checkpoint,"
    " c.error, coalesce(c.owner, h.holder, c.worker) AS owner, c.started_at, c.finished_at,"
    " c.result"
)
_VIEW = (
    f"SELECT c.index, {SHOWN_STATE} AS state, {_ATTEMPT}, coalesce(c.owner, h.holder) AS owner,"
    f" c.checkpoint FROM dtask_children c{HOLDER}"
)


@dataclass(frozen=True)
class ChildDetail:
    """One child as the API and the dashboard show it."""

    index: int
    state: ChildState
    spec: Any  # its range (the child function's keyword arguments)
    attempt: int
    max_attempts: int
    checkpoint: Any
    error: str | None
    worker: str | None  # host:pid running it, else the one that ran its latest attempt
    started_at: datetime | None
    finished_at: datetime | None
    traceback: str | None = None  # of its latest failed attempt (only where asked for)
    output: str | None = None  # the last lines that attempt printed (only where asked for)
    result: Any = None  # what its function returned, once it succeeded

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state.value,
            "spec": self.spec,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "checkpoint": self.checkpoint,
            "error": self.error,
            "worker": self.worker,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "result": self.result,
            **({"traceback": self.traceback} if self.traceback is not None else {}),
            **({"output": self.output} if self.output is not None else {}),
        }


class ChildReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    def view(self, run_id: int, index: int) -> ChildView | None:
        with self.db.tx() as conn:
            row = conn.execute(
                sql(f"{_VIEW} WHERE c.run_id = :run AND c.index = :index"),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else _view(row)

    def first_checkpointed_running(self, run_id: int) -> ChildView | None:
        """The running child of the run with the lowest index that has committed progress."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    f"{_VIEW} WHERE c.run_id = :run AND c.state = 'running'"
                    " AND c.checkpoint IS NOT NULL ORDER BY c.index LIMIT 1"
                ),
                {"run": run_id},
            ).first()
        return None if row is None else _view(row)

    def page(
        self, run_id: int, state: ChildState | None, limit: int, after: int | None
    ) -> list[ChildDetail]:
        """The run's children in index order (only those in ``state``), after index ``after``."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    f"SELECT {_COLUMNS} FROM dtask_children c{HOLDER}"
                    " WHERE c.run_id = :run"
                    f" AND (CAST(:state AS varchar) IS NULL OR {SHOWN_STATE} = :state)"
                    " AND c.index > :after ORDER BY c.index LIMIT :limit"
                ),
                {"run": run_id, "state": state and state.value, "after": -1 if after is None
                 else after, "limit": limit},
            ).all()  # fmt: skip
        return [_detail(r) for r in rows]

    def detail(self, run_id: int, index: int) -> ChildDetail | None:
        """One child, with its latest failed attempt's traceback."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    f"SELECT {_COLUMNS}, c.traceback, c.output FROM dtask_children c{HOLDER}"
                    " WHERE c.run_id = :run AND c.index = :index"
                ),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else _detail(row, row.traceback, row.output)

    def grid(self, run_id: int) -> list[tuple[str, int]]:
        """The run's children in index order as runs of one state: [(state, how many), ...];
        a pending child not yet sent to the broker is ``waiting``. One letter per child
        crosses the wire (about 0.1 s for 100,000 children)."""
        with self.db.tx() as conn:
            letters = conn.execute(
                sql(
                    "SELECT string_agg(CASE WHEN"
                    f" {unsent('(SELECT sent_through FROM dtask_runs WHERE id = :run)')}"
                    "   THEN 'w' ELSE left(state, 1) END, '' ORDER BY index)"
                    " FROM dtask_children WHERE run_id = :run"
                ),
                {"run": run_id},
            ).scalar()
            held = held_ranges(conn, run_id)
        shown = list(letters or "")
        for lo, hi in held:  # the children their messages' claims cover run
            for i in range(lo, min(hi + 1, len(shown))):
                shown[i] = "r" if shown[i] == "p" else shown[i]
        return [(_GRID_STATES[k], sum(1 for _ in g)) for k, g in itertools.groupby(shown)]

    def error(self, run_id: int, index: int) -> str | None:
        with self.db.tx() as conn:
            row = conn.execute(
                sql("SELECT error FROM dtask_children WHERE run_id = :run AND index = :index"),
                {"run": run_id, "index": index},
            ).first()
        return None if row is None else row.error


_GRID_STATES = {"w": "waiting", **{s.value[0]: s.value for s in ChildState}}


def _detail(r: Row[Any], traceback: str | None = None, output: str | None = None) -> ChildDetail:
    return ChildDetail(
        r._mapping["index"], ChildState(r.state), r.spec, r.attempt, r.max_attempts,
        r.checkpoint, r.error, r.owner, r.started_at, r.finished_at, traceback, output, r.result,
    )  # fmt: skip


def _view(row: Row[Any]) -> ChildView:
    return ChildView(
        index=int(row._mapping["index"]),
        state=ChildState(row.state),
        attempt=int(row.attempt),
        owner=row.owner,
        checkpoint=row.checkpoint,
    )
