"""The dispatcher's queries (DTASK_DISPATCH=window): what waits in PostgreSQL, what is out in
the broker, and taking the next children of a run to send. One dispatcher at a time: each
pass runs in one transaction holding a cluster-wide advisory lock, and publishes before it
commits (a crash in between only re-sends; the claim's fence drops the copy)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from dtask.db.clients import CLIENT_COLUMNS, client_from_row
from dtask.db.database import DISPATCH_LOCK, Database, sql
from dtask.db.queued import HELD, QUEUED, unsent
from dtask.db.redispatch import Redispatch
from dtask.db.workers import WorkerInfo, live_on
from dtask.domain.clients import Client
from dtask.domain.dispatch import Demand, Share, messages
from dtask.domain.runs import ChildState
from dtask.exceptions import LeaseLost

RUNS_PER_CLIENT = 200  # a client's runs of one template in one queue a pass reads at most


@dataclass(frozen=True)
class Out:
    """What one queue has out now."""

    queued: int  # sent, not yet claimed: in the broker (or a worker's prefetch)
    running: int


class DispatchPass:
    """One pass's view and actions, inside its transaction."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def live_workers(self, within: float) -> list[WorkerInfo]:
        """``WorkerStore.live``, in this turn's transaction (a pool process's master passes
        with its only connection)."""
        return live_on(self.conn, within)

    def demands(self, per_client: int | None = None) -> dict[str | None, list[Demand]]:
        """Runs with unsent children, per queue: of each client's runs of one template in one
        queue, only the first ``per_client`` (RUNS_PER_CLIENT) by priority, deadline and id.
        Read through an index in that order: one descent per (client, queue, template) to
        find the next group, then at most ``per_client`` rows of each, so a pass costs the
        window and the clients, not the runs waiting (10,000 of them cost ~100 ms).

        That is the head of the order ``dtask.domain.dispatch.plan`` takes a client's runs
        in, but for its fair share between a client's runs of equal priority and deadline:
        their passes live in the dispatcher, so the lowest ids are read, and a run past the
        first ``per_client`` of its group waits until one of those has sent all its children
        (first come, first served beyond the head; within it, shared). Per template, so a
        template no live worker knows (``out``'s ``runnable``) holds none of the others back.
        A pass sends at most ``per_client`` runs' worth a group; the next pass, the rest."""
        rows = self.conn.execute(
            sql(
                "WITH RECURSIVE g AS ("
                " (SELECT client, coalesce(queue, '') AS q, template FROM dtask_runs"
                "  WHERE unsent > 0 AND state = 'running'"
                "  ORDER BY client, coalesce(queue, ''), template LIMIT 1)"
                " UNION ALL"
                " SELECT n.client, n.q, n.template FROM g, LATERAL"
                " (SELECT client, coalesce(queue, '') AS q, template FROM dtask_runs"
                "  WHERE unsent > 0 AND state = 'running'"
                "  AND (client, coalesce(queue, ''), template) > (g.client, g.q, g.template)"
                "  ORDER BY client, coalesce(queue, ''), template LIMIT 1) n)"
                " SELECT r.id, r.client, r.priority, r.deadline, r.unsent, r.queue,"
                " r.child_seconds, r.template, r.child_total FROM g, LATERAL"
                " (SELECT * FROM dtask_runs"
                "  WHERE unsent > 0 AND state = 'running' AND client = g.client"
                "  AND coalesce(queue, '') = g.q AND template = g.template"
                "  ORDER BY priority DESC, deadline ASC NULLS LAST, id LIMIT :k) r"
            ),
            {"k": RUNS_PER_CLIENT if per_client is None else per_client},
        ).all()
        found: dict[str | None, list[Demand]] = {}
        for r in rows:
            demand = Demand(
                r.id,
                r.client,
                r.priority,
                r.deadline,
                r.unsent,
                r.child_seconds,
                r.template,
                r.child_total or 0,
            )
            found.setdefault(r.queue, []).append(demand)
        return found

    def out(
        self, runnable: Callable[[str | None, str], bool] = lambda queue, template: True
    ) -> tuple[dict[str | None, Out], dict[str, int]]:
        """Per queue what is out (queued, running), and per client its children out, but for
        runs that no live worker of their queue can run (``runnable``): the running children
        of any run (a cancelled run's run until their next checkpoint), the queued ones of
        running runs. Counted from the
        children out themselves, through the partial indexes that hold only them (the sent
        and unclaimed; the running), grouped by their runs' queue, client and template: a
        pass costs what is out, not the running runs (10,000 of them cost ~100 ms) nor their
        sizes (one scan of a 100,000-child run's rows took 72 ms)."""
        rows = out_rows(self.conn)
        queues: dict[str | None, Out] = {}
        clients: dict[str, int] = {}
        for r in rows:
            if not (r.queued or r.running) or not runnable(r.queue, r.template):
                continue
            seen = queues.get(r.queue, Out(0, 0))
            queues[r.queue] = Out(seen.queued + r.queued, seen.running + r.running)
            clients[r.client] = clients.get(r.client, 0) + r.queued + r.running
        return queues, clients

    def shares(self, names: set[str], out: dict[str, int]) -> dict[str, Share]:
        rows = self.conn.execute(
            sql(f"SELECT {CLIENT_COLUMNS} FROM dtask_clients WHERE name = ANY(:names)"),
            {"names": sorted(names)},
        ).all()
        found = {r.name: client_from_row(r) for r in rows}
        clients = {name: found.get(name) or Client(name) for name in names}  # no row: no limits
        return {n: Share(c.weight, c.max_running, out.get(n, 0)) for n, c in clients.items()}

    def take(self, run_id: int, count: int, batch: int = 1) -> list[list[Redispatch]]:
        """The run's next ``count`` unsent children, in index order, as the messages they go
        in (``batch`` at most to one, ``dtask.domain.dispatch.messages``), marked sent now:
        a lone child's row by its ``sent_at``, a message of several by a row of its own in
        ``dtask_messages`` (none of its children is written) and the run's mark past them.

        Read from the run's mark up, in the order of its key: the children below the mark were
        taken, written or not; those above, if pending, were never sent (a gift's too), and
        the mark moves past every child read. Asked for pending (or unsent) children instead,
        PostgreSQL went through every pending child of the table and sorted them when the
        run's rows had not been analyzed yet (8 ms for 400 of 10,000)."""
        rows = self.conn.execute(
            sql(
                "SELECT r.id AS run_id, c.index AS position, c.state, c.spec, r.template,"
                " r.group_id, r.queue"
                " FROM dtask_runs r, LATERAL (SELECT index, state, CAST(spec AS text) AS spec"
                "   FROM dtask_children c WHERE c.run_id = r.id AND c.index >= r.sent_through"
                "   ORDER BY c.index LIMIT :n) c"
                " WHERE r.id = :run"
            ),
            {"run": run_id, "n": count},
        ).all()
        pending = [r for r in rows if r.state == ChildState.PENDING.value]
        children = [
            Redispatch(r.run_id, r.position, json.loads(r.spec), r.template, r.group_id, r.queue)
            for r in pending
        ]
        groups, at = [], 0
        for size in messages([_json_bytes(r.spec) for r in pending], batch):
            groups.append(children[at : at + size])
            at += size
        several = [g for g in groups if len(g) > 1]
        self.conn.execute(
            sql(
                "WITH m AS (INSERT INTO dtask_messages (run_id, lo, hi, children)"
                "   SELECT :run, g.lo, g.hi, g.n FROM unnest(CAST(:los AS int[]),"
                "   CAST(:his AS int[]), CAST(:ns AS int[])) AS g(lo, hi, n)"
                "   ON CONFLICT (run_id, lo) DO UPDATE SET hi = excluded.hi,"
                "   children = excluded.children, sent_at = now(), claimed_at = NULL),"
                " one AS (UPDATE dtask_children SET sent_at = now() WHERE run_id = :run"
                "   AND index = ANY(CAST(:lone AS int[])) AND state = 'pending')"
                " UPDATE dtask_runs SET sent_through = greatest(sent_through, :mark),"
                # the count was off (a stray old message claimed one): count again
                " unsent = CASE WHEN :exact THEN greatest(unsent - :n, 0) ELSE"
                "   (SELECT count(*) FROM dtask_children WHERE run_id = :run"
                f"   AND {unsent('greatest(dtask_runs.sent_through, :mark)')}) END"
                " WHERE id = :run"
            ),
            {
                "run": run_id,
                "los": [g[0].index for g in several],
                "his": [g[-1].index for g in several],
                "ns": [len(g) for g in several],
                "lone": [g[0].index for g in groups if len(g) == 1],
                "mark": rows[-1].position + 1 if rows else 0,
                "exact": len(children) == count,
                "n": count,
            },
        )
        return groups


def _json_bytes(text: str) -> int:
    """What a spec's JSON text (PostgreSQL's) weighs in a message's body, at most: kombu
    escapes each character past ASCII as up to twelve."""
    return len(text) if text.isascii() else 12 * len(text)


def out_rows(conn: Connection, client: str | None = None) -> list[Any]:
    """What is out (children queued in the broker, children running), per queue, client and
    template: what ``DispatchPass.out`` counts, of one ``client`` or of all."""
    return list(
        conn.execute(
            sql(
                "SELECT r.queue, r.client, r.template,"
                " sum(c.queued)::int AS queued, sum(c.running)::int AS running"
                f" FROM (SELECT run_id, n AS queued, 0 AS running FROM ({QUEUED}) q"
                "  UNION ALL"
                "  SELECT run_id, 0, count(*) FROM dtask_children"
                "   WHERE state = 'running' AND lease_expires_at IS NOT NULL"  # its index
                "   GROUP BY run_id"
                f"  UNION ALL SELECT run_id, 0, n FROM ({HELD}) h) c,"
                # each run's row by its key alone (LIMIT: not a hash of every run, as the
                # planner would pick for a few hundred runs out; the state filtered after:
                # with it inside, stale statistics made the planner walk the state index
                # for every run out, 18 ms a pass at a thousand small runs)
                " LATERAL (SELECT queue, client, template, state FROM dtask_runs"
                "   WHERE id = c.run_id LIMIT 1) r"
                # a cancelled run's running children hold their slots (and their client's
                # cap) until their next checkpoint stops them; its queued ones will not run
                " WHERE (r.state = 'running' OR c.running > 0)"
                " AND (CAST(:client AS text) IS NULL OR r.client = :client)"
                " GROUP BY r.queue, r.client, r.template"
            ),
            {"client": client},
        ).all()
    )


HOLD = 8.0  # seconds a turn may sit idle unless told: DTASK_LEASE_TTL's default


class DispatchStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @contextmanager
    def turn(self, hold_for: float = HOLD, wait: float = 0.0) -> Iterator[DispatchPass | None]:
        """A pass if this caller gets the dispatcher's turn within ``wait`` seconds (None
        otherwise); what it takes is committed when the block ends without an exception.

        A holder that hangs (SIGSTOP, swap, a paused VM) would stop dispatch everywhere: it
        loses its turn once its transaction has sat idle ``hold_for`` seconds (see
        ``Database.held``), another worker's pass takes over, and the woken holder gets
        LeaseLost with nothing of its pass recorded (what it published is sent again; a
        claim's fence drops the copy)."""
        lost = LeaseLost(
            "the dispatcher's turn ended: held past its limit (this worker was paused, or the"
            " pass ran long); another worker dispatches now"
        )
        deadline = time.monotonic() + wait
        with self.db.held(hold_for, lost) as conn:
            while True:
                mine = conn.execute(
                    sql("SELECT pg_try_advisory_xact_lock(:ns, 0)"), {"ns": DISPATCH_LOCK}
                ).scalar()
                if mine or time.monotonic() >= deadline:
                    break
                time.sleep(TURN_POLL)
            yield DispatchPass(conn) if mine else None


TURN_POLL = 0.005  # seconds between tries for a turn held by another pass (a few ms each)
