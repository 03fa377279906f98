"""Retention: finished runs older than a limit are deleted with their children, a bounded
chunk per transaction, so no lock is held long and workers go on beside it.

Each chunk takes the run's advisory lock and checks again that the run is still finished
and old enough, so a rerun never races a prune: it waits for the chunk, and one that finds
some of its run's children already gone refuses (``RunStore.rerun``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection

from dtask.db.database import Database, lock_run, sql

FINISHED = "state IN ('succeeded', 'failed', 'cancelled')"
_OLD = f"{FINISHED} AND finished_at < now() - make_interval(secs => :age)"


@dataclass(frozen=True)
class Pruned:
    runs: int
    children: int


class RetentionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def count(self, age: float) -> Pruned:
        """What a prune of runs finished over ``age`` seconds ago would delete."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    f"SELECT count(*) AS runs, coalesce(sum(child_total), 0) AS children"
                    f" FROM dtask_runs WHERE {_OLD}"
                ),
                {"age": age},
            ).one()
        return Pruned(int(row.runs), int(row.children))

    def prune(
        self,
        age: float,
        keep_going: Callable[[], bool] = lambda: True,
        runs_per_batch: int = 200,
        children_per_chunk: int = 5_000,
        progress: Callable[[Pruned], None] | None = None,
    ) -> Pruned:
        """Delete runs finished over ``age`` seconds ago with their children, oldest first,
        while ``keep_going()``; what was deleted."""
        runs = children = 0
        while keep_going():
            with self.db.tx() as conn:
                batch = [
                    int(r.id)
                    for r in conn.execute(
                        sql(f"SELECT id FROM dtask_runs WHERE {_OLD} ORDER BY id LIMIT :n"),
                        {"age": age, "n": runs_per_batch},
                    )
                ]
            if not batch:
                break
            for run_id in batch:
                while keep_going():
                    with self.db.tx() as conn:
                        gone = self._chunk(conn, run_id, age, children_per_chunk)
                    if gone is None:
                        break  # no longer finished or old: left alone
                    children += gone
                    if gone < children_per_chunk:
                        with self.db.tx() as conn:
                            runs += self._run(conn, run_id, age)
                        break
                if progress is not None:
                    progress(Pruned(runs, children))
        return Pruned(runs, children)

    @staticmethod
    def _chunk(conn: Connection, run_id: int, age: float, limit: int) -> int | None:
        lock_run(conn, run_id)
        still = conn.execute(
            sql(f"SELECT 1 FROM dtask_runs WHERE id = :id AND {_OLD}"), {"id": run_id, "age": age}
        ).first()
        if still is None:
            return None
        # its children's logs first, a chunk at a time, then the children
        conn.execute(
            sql(
                "DELETE FROM dtask_child_logs WHERE (run_id, index, attempt) IN"
                " (SELECT run_id, index, attempt FROM dtask_child_logs WHERE run_id = :id"
                " LIMIT :limit)"
            ),
            {"id": run_id, "limit": limit},
        )
        return int(
            conn.execute(
                sql(
                    "DELETE FROM dtask_children WHERE id IN (SELECT id FROM dtask_children"
                    " WHERE run_id = :id LIMIT :limit)"
                ),
                {"id": run_id, "limit": limit},
            ).rowcount
        )

    @staticmethod
    def _run(conn: Connection, run_id: int, age: float) -> int:
        lock_run(conn, run_id)
        return int(
            conn.execute(
                sql(f"DELETE FROM dtask_runs WHERE id = :id AND {_OLD}"),
                {"id": run_id, "age": age},
            ).rowcount
        )
