"""Reading runs: one run's status with its children's counts, lists of the latest runs, and
which runs have finished. :class:`RunStore` adds the writes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row

from dtask.db import deps, queued
from dtask.db.database import Database, sql
from dtask.domain.backlog import Backlog
from dtask.domain.clients import DEFAULT_CLIENT, Tier
from dtask.domain.deps import Node
from dtask.domain.runs import ChildCounts, RunState, RunStatus
from dtask.exceptions import RunNotFound, UpstreamNotFound

_RUN_COLUMNS = (
    "id, template, trigger_key, variables, state, created_at, finished_at, error, schedule, slot,"
    " client, priority, deadline, late, tier, notify_url, notify_state, notify_attempts,"
    " start_after, result,"
    " notify_error, notified_at, split_slots, concurrency_key, max_concurrent"
)


@dataclass(frozen=True)
class Graph:
    root: int
    nodes: dict[int, Node]
    upstream: dict[int, list[int]]  # run -> the runs it waits for
    downstream: dict[int, list[int]]  # run -> the runs that wait for it

    def as_json(self) -> dict[str, Any]:
        return {
            "run": self.root,
            "runs": [
                {"id": n.id, "template": n.template, "state": n.state.value}
                for n in self.nodes.values()
            ],
            # [run, upstream]: the first waits for the second
            "edges": sorted(
                {(a, b) for a, bs in self.upstream.items() for b in bs}
                | {(b, a) for a, bs in self.downstream.items() for b in bs}
            ),
        }


def child_results(conn: Connection, run_id: int) -> list[Any]:
    """The run's children's return values, in index order (None where a child returned none)."""
    rows = conn.execute(
        sql("SELECT result FROM dtask_children WHERE run_id = :id ORDER BY index"), {"id": run_id}
    )
    return [r.result for r in rows]


class Traced(NamedTuple):
    """A run as its trace needs it: its submit's context (W3C headers), children, template."""

    context: dict[str, str] | None
    children: int | None
    template: str


class RunReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    def _counts(conn: Connection, run_id: int) -> ChildCounts:
        rows = conn.execute(
            sql(
                "SELECT state, count(*) AS n FROM dtask_children WHERE run_id = :id GROUP BY state"
            ),
            {"id": run_id},
        )
        states = {r.state: r.n for r in rows}
        held = conn.execute(sql(f"SELECT {queued.held(':id')}"), {"id": run_id}).scalar_one()
        queued.as_running(states, held)
        return ChildCounts.from_states(states)

    def status(self, run_id: int) -> RunStatus:
        with self.db.tx() as conn:
            row = conn.execute(
                sql(f"SELECT {_RUN_COLUMNS} FROM dtask_runs WHERE id = :id"), {"id": run_id}
            ).first()
            if row is None:
                raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
            upstreams = deps.waiting_for(conn, [run_id]).get(run_id, ([], []))
            return _status(row, self._counts(conn, run_id), upstreams)

    def unsplit(self, run_ids: list[int]) -> list[int]:
        """Those of ``run_ids`` whose master has yet to split them (pending, or splitting: a
        master that died mid-split), in the order given: a ``dtask.masters`` message sends
        back only these (a cancelled backlog's messages had gone round one run a hop)."""
        left = self._in_states(run_ids, (RunState.PENDING, RunState.SPLITTING))
        return [i for i in run_ids if i in left]

    def _in_states(self, run_ids: Sequence[int], states: Sequence[RunState]) -> set[int]:
        """Which of ``run_ids`` are in one of ``states``, in one query."""
        with self.db.tx() as conn:
            found = conn.execute(
                sql("SELECT id FROM dtask_runs WHERE id = ANY(:ids) AND state = ANY(:states)"),
                {"ids": list(run_ids), "states": [s.value for s in states]},
            ).scalars()
            return set(found)

    def graph(self, run_id: int) -> Graph:
        """The run, what it waits for (transitively) and what waits for it."""
        with self.db.tx() as conn:
            up = deps.edges(conn, run_id, upstream=True)
            down = deps.edges(conn, run_id, upstream=False)
            ids = {run_id} | {i for e in (up, down) for a, bs in e.items() for i in (a, *bs)}
            nodes = deps.nodes(conn, sorted(ids))
        if run_id not in nodes:
            raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
        return Graph(run_id, nodes, up, down)

    def clients_of(
        self, ids: Sequence[int], keys: Sequence[str], client: str
    ) -> dict[int | str, str]:
        """The client of each run named by id (those that exist), and ``client`` for each of
        the trigger keys it has a run of: a key is looked up within ``client`` only (another
        client's run of the same key is not named by it)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT id, NULL AS trigger_key, client FROM dtask_runs WHERE id = ANY(:ids)"
                    " UNION ALL SELECT id, trigger_key, client FROM dtask_runs"
                    " WHERE client = :client AND trigger_key = ANY(:keys)"
                ),
                {"ids": list(ids), "keys": list(keys), "client": client},
            ).all()
        found: dict[int | str, str] = {}
        for r in rows:
            if r.trigger_key is None:
                found[int(r.id)] = r.client
            else:
                found[r.trigger_key] = r.client
        return found

    def backlog(self, queues: Sequence[str], client: str) -> Backlog:
        """Unfinished runs (pending, splitting, running) whose children go to one of
        ``queues`` (a run of the default queue's basic tier has none stored: ``""`` names it),
        how many other clients hold some of them and how many are ``client``'s, and all of
        ``client``'s unfinished runs."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "SELECT count(*) FILTER (WHERE here) AS queue,"
                    " count(DISTINCT client) FILTER (WHERE here AND client <> :client) AS others,"
                    " count(*) FILTER (WHERE here AND client = :client) AS mine,"
                    " count(*) FILTER (WHERE client = :client) AS client"
                    " FROM (SELECT client, coalesce(queue, '') = ANY(:queues) AS here"
                    "   FROM dtask_runs WHERE state IN ('pending', 'splitting', 'running')) r"
                ),
                {"queues": list(queues), "client": client},
            ).one()
        return Backlog(int(row.queue), int(row.others), int(row.mine), int(row.client))

    def ids_by_key(self, keys: Sequence[str], client: str = DEFAULT_CLIENT) -> dict[str, int]:
        """The runs those trigger keys of ``client`` triggered (UpstreamNotFound names a key
        that none of its runs has; another client's run of that key does not count)."""
        with self.db.tx() as conn:
            found = {
                r.trigger_key: int(r.id)
                for r in conn.execute(
                    sql(
                        "SELECT id, trigger_key FROM dtask_runs"
                        " WHERE client = :client AND trigger_key = ANY(:keys)"
                    ),
                    {"keys": list(keys), "client": client},
                )
            }
        missing = [k for k in keys if k not in found]
        if missing:
            raise UpstreamNotFound(
                f"after: no run with the key {missing[0]!r}; a run can only wait for runs"
                " that exist (see `dtask runs`)"
            )
        return found

    def trace_of(self, run_id: int) -> Traced:
        """The run's stored trace context (dtask/worker/traces.py), its children's count once
        split, and its template."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql("SELECT trace_context, child_total, template FROM dtask_runs WHERE id = :id"),
                {"id": run_id},
            ).first()
        if row is None:
            return Traced(None, None, "")
        return Traced(row.trace_context, row.child_total, row.template)

    def state_of(self, run_id: int) -> RunState:
        """The run's state alone: one row, whatever the number of its children."""
        with self.db.tx() as conn:
            state = conn.execute(
                sql("SELECT state FROM dtask_runs WHERE id = :id"), {"id": run_id}
            ).scalar()
        if state is None:
            raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
        return RunState(state)

    def finished_among(self, run_ids: Sequence[int]) -> set[int]:
        """Which of ``run_ids`` have finished (what every long poll of a server waits on, in
        one query)."""
        return self._in_states(run_ids, [s for s in RunState if s.finished])

    def statuses(
        self,
        limit: int = 50,
        schedule: str | None = None,
        *,
        client: str | None = None,
        state: RunState | None = None,
        template: str | None = None,
        before: int | None = None,
    ) -> list[RunStatus]:
        """The latest runs, newest first (older than run ``before`` if given); only those
        matching each filter given."""
        filters = {"schedule": schedule, "client": client, "template": template}
        where = [f"{name} = :{name}" for name, value in filters.items() if value is not None]
        if state is not None:
            where.append("state = :state")
        if before is not None:
            where.append("id < :before")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    f"SELECT {_RUN_COLUMNS} FROM dtask_runs {clause} ORDER BY id DESC LIMIT :limit"
                ),
                {**filters, "limit": limit, "state": state and state.value, "before": before},
            ).all()
            counts: dict[int, dict[str, int]] = {r.id: {} for r in rows}
            for c in conn.execute(
                sql(
                    "SELECT run_id, state, count(*) AS n FROM dtask_children"
                    " WHERE run_id = ANY(:ids) GROUP BY run_id, state"
                ),
                {"ids": list(counts)},
            ):
                counts[c.run_id][c.state] = c.n
            upstreams = deps.waiting_for(conn, list(counts))
        return [
            _status(r, ChildCounts.from_states(counts[r.id]), upstreams.get(r.id, ([], [])))
            for r in rows
        ]


def _status(
    row: Row[Any], counts: ChildCounts, upstreams: tuple[list[int], list[int]]
) -> RunStatus:
    return RunStatus(
        id=row.id,
        template=row.template,
        key=row.trigger_key,
        state=RunState(row.state),
        variables=row.variables,
        children=counts,
        created_at=row.created_at,
        finished_at=row.finished_at,
        error=row.error,
        schedule=row.schedule,
        slot=row.slot,
        client=row.client,
        priority=row.priority,
        deadline=row.deadline,
        start_after=row.start_after,
        result=row.result,
        late=row.late,
        tier=Tier(row.tier),
        after=tuple(upstreams[0]),
        waiting_for=tuple(upstreams[1]),
        slots=row.split_slots,
        concurrency_key=row.concurrency_key,
        max_concurrent=row.max_concurrent,
        notify=None
        if row.notify_url is None
        else {
            "url": row.notify_url,
            "state": row.notify_state,
            "attempts": row.notify_attempts,
            "error": row.notify_error,
            "delivered_at": row.notified_at.isoformat() if row.notified_at else None,
        },
    )
