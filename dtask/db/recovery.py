"""The reaper's queries: one reaper's turn cluster-wide, expired leases, stalled and stuck
runs, runs whose chord callback never ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from dtask.db.database import REAPER_LOCK, Database, sql
from dtask.domain.runs import RunState
from dtask.exceptions import LeaseLost


@dataclass(frozen=True)
class Redispatch:
    """Everything needed to re-send one child message with its original identity."""

    run_id: int
    index: int
    spec: dict[str, Any]
    template: str
    group_id: str
    queue: str | None


class RecoveryStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @contextmanager
    def turn(self, hold_for: float) -> Iterator[bool]:
        """True inside the block for one caller cluster-wide at a time.

        A hung leader would block failover everywhere: it loses its turn after ``hold_for``
        seconds idle (see ``Database.held``), so a survivor takes over. Every reaper action is
        conditional and idempotent, so a woken leader overlapping a new one is harmless.
        """
        lost = LeaseLost(
            "the reaper's turn ended: held past its limit (this worker was paused, or the"
            " pass ran long); another worker reaps now"
        )
        with self.db.held(hold_for, lost) as conn:
            yield bool(
                conn.execute(
                    sql("SELECT pg_try_advisory_xact_lock(:ns, 0)"), {"ns": REAPER_LOCK}
                ).scalar()
            )

    def release_expired(self, limit: int = 1000) -> list[Redispatch]:
        """Expired leases (their owner died or hung) -> pending again; returns those of running
        runs, to be re-sent at once.

        Every expired row is released, whatever its run's state (a cancelled run's child whose
        owner died keeps a stale lease otherwise), those of running runs first, so stale rows
        never fill the limit ahead of children that can run.
        The dead owner's attempt stays counted, so a child that kills its process every time
        runs out of attempts instead of looping.
        """
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "UPDATE dtask_children c SET state = 'pending', owner = NULL,"
                    " lease_expires_at = NULL, updated_at = now()"
                    " FROM dtask_runs r WHERE c.id IN ("
                    "   SELECT e.id FROM dtask_children e JOIN dtask_runs er ON er.id = e.run_id"
                    "   WHERE e.state = 'running' AND e.lease_expires_at < now()"
                    "   ORDER BY er.state = 'running' DESC, e.lease_expires_at LIMIT :limit"
                    "   FOR UPDATE OF e SKIP LOCKED)"
                    " AND r.id = c.run_id"
                    " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue,"
                    " r.state = 'running' AS resend"
                ),
                {"limit": limit},
            ).all()
        return [_redispatch(r) for r in rows if r.resend]

    def stalled_runs(self, stall: float) -> list[tuple[int, str | None]]:
        """(run id, queue) of running runs with pending children where no child has changed
        for ``stall`` seconds: their messages may be lost (broker restarted, or prefetched
        by a worker that died). Heartbeats do not count as change."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT r.id, r.queue FROM dtask_runs r WHERE r.state = 'running'"
                    " AND r.updated_at < now() - make_interval(secs => :stall)"
                    " AND EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.state = 'pending')"
                    " AND NOT EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.updated_at > now() - make_interval(secs => :stall))"
                    " ORDER BY r.id LIMIT 100"
                ),
                {"stall": stall},
            ).all()
        return [(int(r.id), r.queue) for r in rows]

    def pending_children(self, run_id: int, limit: int = 10_000) -> list[Redispatch]:
        """The run's pending children, to re-send; marks the run touched so this is rate-limited
        to once per stall period."""
        with self.db.tx() as conn:
            conn.execute(
                sql("UPDATE dtask_runs SET updated_at = now() WHERE id = :id"), {"id": run_id}
            )
            rows = conn.execute(
                sql(
                    "SELECT c.run_id, c.index, c.spec, r.template, r.group_id, r.queue"
                    " FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                    " WHERE c.run_id = :id AND c.state = 'pending' ORDER BY c.index LIMIT :limit"
                ),
                {"id": run_id, "limit": limit},
            ).all()
        return [_redispatch(r) for r in rows]

    def stuck_runs(self, stall: float) -> list[tuple[int, RunState]]:
        """Runs left in pending/splitting for ``stall`` seconds with no master working on them
        (its advisory lock is free): the submitter or the master's worker died, or the master
        message is lost."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT id, state FROM dtask_runs WHERE state IN ('pending', 'splitting')"
                    " AND updated_at < now() - make_interval(secs => :stall) ORDER BY id LIMIT 100"
                ),
                {"stall": stall},
            ).all()
        return [(int(r.id), RunState(r.state)) for r in rows]

    def unfinalized_runs(self, settled_for: float) -> list[int]:
        """Running runs whose children all finished over ``settled_for`` seconds ago: their
        chord callback never ran (lost with its worker, or Redis lost the chord's counts)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT r.id FROM dtask_runs r WHERE r.state = 'running'"
                    " AND NOT EXISTS (SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.state IN ('pending', 'running'))"
                    " AND (SELECT max(finished_at) FROM dtask_children c WHERE c.run_id = r.id)"
                    "   < now() - make_interval(secs => :settled)"
                    " ORDER BY r.id LIMIT 100"
                ),
                {"settled": settled_for},
            ).all()
        return [int(r.id) for r in rows]


def _redispatch(row: Row[Any]) -> Redispatch:
    return Redispatch(
        run_id=int(row.run_id),
        index=int(row._mapping["index"]),
        spec=row.spec,
        template=row.template,
        group_id=row.group_id,
        queue=row.queue,
    )
