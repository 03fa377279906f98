"""The reaper's queries: one reaper's turn cluster-wide, expired leases, stalled and stuck
runs, runs whose chord callback never ran, runs past their deadline."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from dtask.db import counters, deps, message_claims
from dtask.db.children import unfinished
from dtask.db.database import REAPER_LOCK, RUN_LOCKS, Database, sql
from dtask.db.queued import queued
from dtask.db.redispatch import Redispatch, redispatch_from_row
from dtask.domain.deadlines import OnLate, late_error
from dtask.domain.runs import RunState
from dtask.exceptions import LeaseLost

MASTERS_WHILE_MOVING = 10  # overtaken runs whose master a pass re-sends while masters move

# The front of the masters' queue: the newest run that started within the stall timeout (a
# started run still active, or one finished since: started_at <= finished_at, so the
# finished_at index finds it), not counting runs held back by a countdown (their message
# waits in a worker, not in the queue); NULL when no master moved.
_FRONT = (
    "greatest((SELECT max(m.id) FROM dtask_runs m WHERE m.state IN ('splitting', 'running')"
    "   AND m.started_at > now() - make_interval(secs => :stall) AND m.start_after IS NULL),"
    " (SELECT max(m.id) FROM dtask_runs m"
    "   WHERE m.state IN ('succeeded', 'failed', 'cancelled')"
    "   AND m.finished_at > now() - make_interval(secs => :stall)"
    "   AND m.started_at > now() - make_interval(secs => :stall) AND m.start_after IS NULL))"
)


@dataclass(frozen=True)
class Waiting:
    """Children whose messages should be waiting in one queue's broker queue."""

    queue: str | None
    pending: int
    overdue: int  # sent over a stall timeout ago
    started: int  # children started within a stall timeout: the queue moves
    templates: tuple[str, ...] = ()  # of the runs counted
    fastest: float | None = None  # the shortest child time of those runs (their batches)


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

    def release_expired(self, limit: int = 1000, lease_ttl: float = 8.0) -> list[Redispatch]:
        """Expired leases (their owner died or hung) -> pending again; returns those of running
        runs, to be re-sent at once.

        Every expired row is released, whatever its run's state (a cancelled run's child whose
        owner died keeps a stale lease otherwise), those of running runs first, so stale rows
        never fill the limit ahead of children that can run.
        The dead owner's attempt stays counted, so a child that kills its process every time
        runs out of attempts instead of looping.

        A message's claim whose lease expired is let go: the children it still covered are
        re-sent each on its own (``message_claims``), their attempts not counted.

        Counted for /metrics: each expiry, each re-send, and the failover time (from the
        owner's last lease renewal, ``lease_ttl`` before its expiry, to this re-send).
        """
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "WITH e AS ("
                    "   SELECT e.id, e.lease_expires_at FROM dtask_children e"
                    "   JOIN dtask_runs er ON er.id = e.run_id"
                    "   WHERE e.state = 'running' AND e.lease_expires_at < now()"
                    "   ORDER BY er.state = 'running' DESC, e.lease_expires_at LIMIT :limit"
                    "   FOR UPDATE OF e SKIP LOCKED)"
                    " UPDATE dtask_children c SET state = 'pending', owner = NULL,"
                    " lease_expires_at = NULL, updated_at = now(), sent_at = now()"
                    " FROM e, dtask_runs r WHERE c.id = e.id AND r.id = c.run_id"
                    " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue,"
                    " r.state = 'running' AS resend,"
                    " extract(epoch FROM now() - e.lease_expires_at) AS overdue"
                ),
                {"limit": limit},
            ).all()
            rows = [*rows, *message_claims.expire(conn, limit)]
            resent = [r for r in rows if r.resend]
            counters.add(conn, counters.LEASE_EXPIRIES, len(rows))
            counters.add(conn, counters.REDISPATCHED, len(resent))
            counters.observe_failovers(conn, (lease_ttl + float(r.overdue) for r in resent))
        return [redispatch_from_row(r) for r in resent]

    def waiting(
        self,
        stall: float,
        runnable: Callable[[str | None, str], bool] = lambda queue, template: True,
    ) -> list[Waiting]:
        """Per queue of running runs that a live worker can run (``runnable``): how many
        children are pending (their messages should be in the broker), how many of those were
        sent over ``stall`` seconds ago, and how many children started within ``stall``
        (whether anyone consumes the queue)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT r.queue, r.template, min(r.child_seconds) AS fastest,"
                    " sum(q.n) AS pending, sum(q.overdue) AS overdue"
                    f" FROM ({queued(overdue=True)}) q"  # unsent: not lost
                    " JOIN dtask_runs r ON r.id = q.run_id"
                    " WHERE r.state = 'running' GROUP BY r.queue, r.template"
                ),
                {"stall": stall},
            ).all()
            # Only an overdue child asks whether its queue moves: that reads every started
            # child of the running runs (no index has started_at), not what is out
            started: dict[tuple[str | None, str], int] = {}
            if any(r.overdue for r in rows):
                started = {
                    (m.queue, m.template): int(m.started)
                    for m in conn.execute(
                        sql(
                            "SELECT r.queue, r.template, count(*) AS started"
                            " FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                            " WHERE c.state <> 'pending'"
                            " AND c.started_at > now() - make_interval(secs => :stall)"
                            " AND r.state = 'running' GROUP BY r.queue, r.template"
                        ),
                        {"stall": stall},
                    )
                }
        queues: dict[str | None, Waiting] = {}
        for r in rows:
            if not runnable(r.queue, r.template):
                continue
            w = queues.get(r.queue, Waiting(r.queue, 0, 0, 0))
            times = [t for t in (w.fastest, r.fastest) if t is not None]
            queues[r.queue] = Waiting(
                r.queue,
                w.pending + int(r.pending),
                w.overdue + int(r.overdue),
                w.started + started.get((r.queue, r.template), 0),
                (*w.templates, r.template),
                min(times, default=None),
            )
        return list(queues.values())

    def take_overdue(
        self, queue: str | None, templates: Sequence[str], stall: float, limit: int
    ) -> list[Redispatch]:
        """About ``limit`` pending children of running runs of ``templates`` in ``queue`` sent
        longest ago (over ``stall`` seconds), marked sent now: the caller re-sends them, each
        on its own. A message of several not taken (``dtask_messages``) goes whole: its
        children still pending and unwritten are marked sent, the message taken.

        Oldest first: in a queue each broker delivers in order, so a lost message is older than
        every message still waiting; only the queue's head and messages held by workers
        (prefetched, or a retry's countdown) come before it."""
        params = {"queue": queue, "templates": list(templates), "stall": stall}
        with self.db.tx() as conn:
            rows = list(
                conn.execute(
                    sql(
                        "WITH o AS (SELECT m.id, m.children,"
                        "   sum(m.children) OVER (ORDER BY m.sent_at, m.id) AS upto"
                        "   FROM dtask_messages m JOIN dtask_runs q ON q.id = m.run_id"
                        "   WHERE m.claimed_at IS NULL"
                        "   AND m.sent_at < now() - make_interval(secs => :stall)"
                        "   AND q.state = 'running' AND q.queue IS NOT DISTINCT FROM :queue"
                        "   AND q.template = ANY(:templates)"
                        "   ORDER BY m.sent_at, m.id LIMIT :limit),"
                        " m AS (UPDATE dtask_messages m SET claimed_at = now() FROM o"
                        "   WHERE m.id = o.id AND o.upto - o.children < :limit"
                        "   AND m.claimed_at IS NULL RETURNING m.run_id, m.lo, m.hi)"
                        " UPDATE dtask_children c SET sent_at = now() FROM m, dtask_runs r"
                        " WHERE c.run_id = m.run_id AND c.index BETWEEN m.lo AND m.hi"
                        " AND c.state = 'pending' AND c.sent_at IS NULL"
                        " AND r.id = c.run_id AND c.index < r.sent_through"
                        " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue"
                    ),
                    {**params, "limit": limit},
                ).all()
            )
            rows += conn.execute(
                sql(
                    "UPDATE dtask_children c SET sent_at = now() FROM dtask_runs r"
                    " WHERE c.id IN ("
                    "   SELECT o.id FROM dtask_children o JOIN dtask_runs q ON q.id = o.run_id"
                    "   WHERE o.state = 'pending'"
                    "   AND o.sent_at < now() - make_interval(secs => :stall)"
                    "   AND q.state = 'running' AND q.queue IS NOT DISTINCT FROM :queue"
                    "   AND q.template = ANY(:templates)"
                    "   ORDER BY o.sent_at, o.id LIMIT :limit FOR UPDATE OF o SKIP LOCKED)"
                    " AND r.id = c.run_id"
                    " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue"
                ),
                {**params, "limit": max(limit - len(rows), 0)},
            ).all()
            counters.add(conn, counters.REDISPATCHED, len(rows))
        return sorted((redispatch_from_row(r) for r in rows), key=lambda c: (c.run_id, c.index))

    def note_lost(self, queue: str, missing: int, resent: int) -> None:
        """The reaper found ``queue``'s broker ``missing`` messages short and re-sent
        ``resent`` children: the ``messages_lost`` alert's fact."""
        with self.db.tx() as conn:
            conn.execute(
                sql(
                    "INSERT INTO dtask_lost_messages (queue, missing, resent, found_at)"
                    " VALUES (:queue, :missing, :resent, now()) ON CONFLICT (queue) DO UPDATE"
                    " SET missing = excluded.missing, resent = excluded.resent,"
                    " found_at = excluded.found_at"
                ),
                {"queue": queue, "missing": missing, "resent": resent},
            )

    def take_stuck(
        self, stall: float, limit: int = 100, while_moving: int = MASTERS_WHILE_MOVING
    ) -> list[tuple[int, RunState]]:
        """Runs left in pending/splitting for ``stall`` seconds whose master is not working on
        them (its advisory lock is free) and was not re-sent within ``stall``: the submitter or
        the master's worker died, or the master message is lost. Marked as re-sent now;
        oldest first.

        A stuck run is queued or lost, and its row alone cannot tell which. While masters
        move (some run started splitting within ``stall``), one waiting that long is most
        likely queued behind a backlog (a burst of submits): re-sending every one doubled
        the masters' work (9,770 of 10,000 one-child runs' masters sent twice in a 165 s
        backlog). Every master goes to the one default queue, delivered in order, so a run
        older (a lower id) than the newest run that started within ``stall`` (the queue's
        front) was overtaken: its master is lost (or held by a busy worker). Then only
        those are re-sent, the oldest ``while_moving`` a pass (each then not again for
        ``stall``): a lost master is re-sent soon after the queue passed its place, and one
        still queued behind the front is not. When no master moved for ``stall`` (no worker
        takes them, or they were all lost) up to ``limit`` are, as before."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "WITH f AS (SELECT " + _FRONT + " AS front)"
                    " UPDATE dtask_runs SET master_sent_at = now() WHERE id IN ("
                    "   SELECT id FROM dtask_runs WHERE state IN ('pending', 'splitting')"
                    "   AND (start_after IS NULL OR start_after <= now())"
                    "   AND updated_at < now() - make_interval(secs => :stall)"
                    "   AND (master_sent_at IS NULL"
                    "     OR master_sent_at < now() - make_interval(secs => :stall))"
                    "   AND id < coalesce((SELECT front FROM f), 9223372036854775807)"
                    "   AND pg_try_advisory_xact_lock(:ns, (id & 2147483647)::int)"
                    "   ORDER BY id LIMIT CASE WHEN (SELECT front FROM f) IS NULL THEN :limit"
                    "     ELSE :few END FOR UPDATE SKIP LOCKED)"
                    " RETURNING id, state"
                ),
                {"stall": stall, "limit": limit, "few": min(while_moving, limit), "ns": RUN_LOCKS},
            ).all()
        return sorted((int(r.id), RunState(r.state)) for r in rows)

    def unfinalized_runs(self, settled_for: float) -> list[int]:
        """Running runs whose children all finished over ``settled_for`` seconds ago: their
        chord callback never ran (lost with its worker, or Redis lost the chord's counts)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    # OFFSET 0: the planner would read every child's finished_at of each
                    # running run (a scan of a 100,000-child run's rows a pass) before
                    # asking whether one is unfinished; first that
                    "SELECT id FROM (SELECT r.id FROM dtask_runs r WHERE r.state = 'running'"
                    f"   AND NOT ({unfinished('r.id')}) OFFSET 0) done"
                    " WHERE (SELECT max(finished_at) FROM dtask_children c"
                    "   WHERE c.run_id = done.id) < now() - make_interval(secs => :settled)"
                    " ORDER BY id LIMIT 100"
                ),
                {"settled": settled_for},
            ).all()
        return [int(r.id) for r in rows]

    def settle_waiting(self, limit: int = 100) -> list[int]:
        """Waiting runs whose upstreams all finished but that were never settled: released
        (returned, their masters to send) or failed."""
        with self.db.tx() as conn:
            return deps.settle_orphans(conn, limit)

    def take_late(self, limit: int = 1000) -> list[LateRun]:
        """Decide the runs whose deadline has passed: on time if a child started by it, late
        otherwise; a late run with ``on_late = 'fail'`` is failed (its children never start).
        Each run is decided once."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT r.id, r.deadline, r.delay_tolerance, r.on_late, EXISTS ("
                    "   SELECT 1 FROM dtask_children c WHERE c.run_id = r.id"
                    "   AND c.started_at <= r.deadline) AS on_time"
                    " FROM dtask_runs r WHERE r.late IS NULL AND r.deadline < now()"
                    " AND r.state IN ('waiting', 'pending', 'splitting', 'running')"
                    " ORDER BY r.deadline LIMIT :limit FOR UPDATE SKIP LOCKED"
                ),
                {"limit": limit},
            ).all()
            if not rows:
                return []
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET late = NOT d.on_time FROM (SELECT"
                    " unnest(CAST(:ids AS bigint[])) AS id,"
                    " unnest(CAST(:on_time AS boolean[])) AS on_time) d"
                    " WHERE dtask_runs.id = d.id"
                ),
                {"ids": [r.id for r in rows], "on_time": [r.on_time for r in rows]},
            )
            late = [r for r in rows if not r.on_time]
            failed = {
                r.id: late_error(r.delay_tolerance, r.deadline)
                for r in late
                if r.on_late == OnLate.FAIL.value
            }
            for run_id, error in failed.items():
                changed = conn.execute(
                    sql(
                        "UPDATE dtask_runs SET state = 'failed', error = :error,"
                        " finished_at = now(), updated_at = now() WHERE id = :id"
                        " AND state IN ('waiting', 'pending', 'splitting', 'running')"
                    ),
                    {"id": run_id, "error": error},
                )
                if changed.rowcount:
                    deps.fail_downstream(conn, run_id, RunState.FAILED)
        return [LateRun(r.id, r.deadline, r.delay_tolerance, r.id in failed) for r in late]


@dataclass(frozen=True)
class LateRun:
    run_id: int
    deadline: datetime
    tolerance: float
    failed: bool  # on_late = 'fail': failed instead of running late
