"""Dependencies between runs in PostgreSQL (``dtask_run_deps``).

A run submitted after others is inserted ``waiting`` under a share lock on each upstream's row,
so an upstream's state cannot change between that read and the commit. The transaction that
finishes an upstream settles its waiting dependents: each is locked (in id order), then
released to ``pending`` if every upstream has succeeded, as a statement that sees what the
other upstreams' transactions committed before it got the lock; or failed, with its own
dependents, when the upstream failed or was cancelled. The caller sends the released runs'
masters after its commit; the reaper's pass settles any waiting run whose upstreams all
finished without settling it (a worker of an older dtask, a settle that failed)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from dtask.db import concurrency
from dtask.db.database import sql
from dtask.domain.deps import Node, start_state, upstream_error
from dtask.domain.runs import RunState
from dtask.exceptions import UpstreamNotFound

_UNFINISHED_UPSTREAM = (
    "EXISTS (SELECT 1 FROM dtask_run_deps d JOIN dtask_runs u ON u.id = d.upstream_id"
    " WHERE d.run_id = r.id AND u.state NOT IN ('succeeded', 'failed', 'cancelled'))"
)


def lock_upstreams(conn: Connection, ids: Sequence[int]) -> dict[int, RunState]:
    """Each upstream's state, its row share-locked until the commit (UpstreamNotFound names
    the first missing one)."""
    rows = conn.execute(
        sql("SELECT id, state FROM dtask_runs WHERE id = ANY(:ids) ORDER BY id FOR SHARE"),
        {"ids": list(ids)},
    ).all()
    found = {int(r.id): RunState(r.state) for r in rows}
    missing = [i for i in ids if i not in found]
    if missing:
        raise UpstreamNotFound(
            f"after: no run with id {missing[0]}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            + "; a run can only wait for runs that exist (see `dtask runs`)"
        )
    return found


def initial_state(conn: Connection, ids: Sequence[int]) -> tuple[RunState, str | None]:
    return start_state(lock_upstreams(conn, ids)) if ids else (RunState.PENDING, None)


def insert(conn: Connection, run_id: int, upstreams: Sequence[int]) -> None:
    if upstreams:
        conn.execute(
            sql(
                "INSERT INTO dtask_run_deps (run_id, upstream_id)"
                " SELECT :id, unnest(CAST(:ups AS bigint[]))"
            ),
            {"id": run_id, "ups": list(upstreams)},
        )


def insert_many(conn: Connection, run_ids: Sequence[int], upstreams: Sequence[int]) -> None:
    """Each of ``run_ids`` waits for every one of ``upstreams`` (a bulk submit's runs)."""
    if upstreams and run_ids:
        conn.execute(
            sql(
                "INSERT INTO dtask_run_deps (run_id, upstream_id)"
                " SELECT r, u FROM unnest(CAST(:ids AS bigint[])) AS r,"
                " unnest(CAST(:ups AS bigint[])) AS u"
            ),
            {"ids": list(run_ids), "ups": list(upstreams)},
        )


def upstreams_of_many(conn: Connection, run_ids: Sequence[int]) -> dict[int, list[int]]:
    """Each run's upstreams, sorted (runs without any are left out)."""
    rows = conn.execute(
        sql(
            "SELECT run_id, array_agg(upstream_id ORDER BY upstream_id) AS ups"
            " FROM dtask_run_deps WHERE run_id = ANY(CAST(:ids AS bigint[])) GROUP BY run_id"
        ),
        {"ids": list(run_ids)},
    ).all()
    return {int(r.run_id): [int(u) for u in r.ups] for r in rows}


def upstreams_of(conn: Connection, run_id: int) -> list[int]:
    return upstreams_of_many(conn, [run_id]).get(run_id, [])


def settle(
    conn: Connection, run_id: int, state: RunState, key: concurrency.Key | None = None
) -> list[int]:
    """``run_id`` (of concurrency ``key``, if any) has just become ``state`` in this
    transaction: its waiting dependents released or failed, and the next runs of its key
    admitted; those that start are returned (their masters are to be sent after the commit)."""
    keys = [] if key is None else [key]
    if state is RunState.SUCCEEDED:
        return release(conn, waiting_dependents(conn, [run_id]), keys)
    if state in (RunState.FAILED, RunState.CANCELLED):
        fail_downstream(conn, run_id, state)
    return concurrency.admit(conn, keys)


def waiting_dependents(conn: Connection, upstreams: Sequence[int]) -> list[int]:
    """Locked, in id order (two upstreams' transactions never wait on each other in a cycle)."""
    return [
        int(r.id)
        for r in conn.execute(
            sql(
                "SELECT id FROM dtask_runs WHERE state = 'waiting' AND id IN (SELECT run_id"
                " FROM dtask_run_deps WHERE upstream_id = ANY(:ups)) ORDER BY id FOR UPDATE"
            ),
            {"ups": list(upstreams)},
        )
    ]


def release(
    conn: Connection, candidates: Sequence[int], keys: Sequence[concurrency.Key] = ()
) -> list[int]:
    """Those of the (locked) waiting ``candidates`` whose every upstream has succeeded, moved
    to pending; those of a concurrency key when their key admits them, with what ``keys``
    admit (the keys' locks the last this transaction takes). A statement of its own: it sees
    what was committed before the locks."""
    if not candidates:
        return concurrency.admit(conn, keys)
    rows = conn.execute(
        sql(
            "UPDATE dtask_runs r SET state = 'pending', updated_at = now()"
            " WHERE r.id = ANY(:ids) AND r.state = 'waiting' AND r.concurrency_key IS NULL"
            " AND NOT EXISTS ("
            "   SELECT 1 FROM dtask_run_deps d JOIN dtask_runs u ON u.id = d.upstream_id"
            "   WHERE d.run_id = r.id AND u.state <> 'succeeded')"
            " RETURNING r.id"
        ),
        {"ids": list(candidates)},
    ).all()
    waiting = concurrency.waiting_keys(conn, candidates, len(candidates))
    admitted = concurrency.admit(conn, [*keys, *waiting])
    return sorted({*(int(r.id) for r in rows), *admitted})


def fail_downstream(conn: Connection, run_id: int, state: RunState) -> int:
    """Fail the waiting runs after ``run_id`` (which failed or was cancelled), then theirs,
    level by level; the number failed. Each names the upstream it waited for. The whole
    waiting downstream is locked first, in id order, as every settle locks: two of them never
    wait on each other in a cycle."""
    locked = [
        int(r.id)
        for r in conn.execute(
            sql(
                "WITH RECURSIVE down(id) AS ("
                " SELECT run_id FROM dtask_run_deps WHERE upstream_id = :id"
                " UNION SELECT d.run_id FROM dtask_run_deps d JOIN down ON d.upstream_id = down.id)"
                " SELECT id FROM dtask_runs WHERE state = 'waiting'"
                " AND id IN (SELECT id FROM down) ORDER BY id FOR UPDATE"
            ),
            {"id": run_id},
        )
    ]
    failed, frontier = 0, [run_id]
    while frontier and locked:
        rows = conn.execute(
            sql(
                "UPDATE dtask_runs r SET state = 'failed', error = CASE"
                "   WHEN d.upstream = :origin THEN :first ELSE 'upstream run ' || d.upstream"
                "   || ' failed' END, finished_at = now(), updated_at = now()"
                " FROM (SELECT run_id, min(upstream_id) AS upstream FROM dtask_run_deps"
                "   WHERE upstream_id = ANY(:ups) AND run_id = ANY(:locked) GROUP BY run_id) d"
                " WHERE r.id = d.run_id AND r.state = 'waiting' RETURNING r.id"
            ),
            {
                "ups": frontier,
                "locked": locked,
                "origin": run_id,
                "first": upstream_error(run_id, state),
            },
        ).all()
        frontier = [int(r.id) for r in rows]
        failed += len(frontier)
    return failed


def settle_orphans(conn: Connection, limit: int) -> list[int]:
    """Waiting runs whose upstreams have all finished, settled here (the safety net for a
    settle that never ran), and runs that wait for a concurrency key with room (an older
    dtask finished a run of their key); the released ones, whose masters are to be sent."""
    ids = [
        int(r.id)
        for r in conn.execute(
            sql(
                "SELECT r.id FROM dtask_runs r WHERE r.state = 'waiting'"
                f" AND NOT {_UNFINISHED_UPSTREAM} AND (r.concurrency_key IS NULL OR EXISTS ("
                "   SELECT 1 FROM dtask_run_deps d JOIN dtask_runs u ON u.id = d.upstream_id"
                "   WHERE d.run_id = r.id AND u.state <> 'succeeded'))"
                " ORDER BY r.id LIMIT :limit FOR UPDATE SKIP LOCKED"
            ),
            {"limit": limit},
        )
    ]
    released = release(conn, ids)
    for run_id in sorted(set(ids) - set(released)):
        ups = {
            int(r.id): RunState(r.state)
            for r in conn.execute(
                sql(
                    "SELECT u.id, u.state FROM dtask_run_deps d JOIN dtask_runs u"
                    " ON u.id = d.upstream_id WHERE d.run_id = :id"
                ),
                {"id": run_id},
            )
        }
        state, error = start_state(ups)
        if state is RunState.FAILED:
            conn.execute(
                sql(
                    "UPDATE dtask_runs SET state = 'failed', error = :error, finished_at = now(),"
                    " updated_at = now() WHERE id = :id AND state = 'waiting'"
                ),
                {"id": run_id, "error": error},
            )
            fail_downstream(conn, run_id, RunState.FAILED)
    stuck = concurrency.waiting_keys(conn, None, limit)  # an older dtask finished their runs
    return sorted({*released, *concurrency.admit(conn, stuck)})


def waiting_for(conn: Connection, run_ids: Sequence[int]) -> dict[int, tuple[list[int], list[int]]]:
    """For each run: (its upstreams, those not finished), in id order."""
    found: dict[int, tuple[list[int], list[int]]] = {}
    for r in conn.execute(
        sql(
            "SELECT d.run_id, d.upstream_id, u.state FROM dtask_run_deps d"
            " LEFT JOIN dtask_runs u ON u.id = d.upstream_id"
            " WHERE d.run_id = ANY(:ids) ORDER BY d.run_id, d.upstream_id"
        ),
        {"ids": list(run_ids)},
    ):
        after, unfinished = found.setdefault(int(r.run_id), ([], []))
        after.append(int(r.upstream_id))
        if r.state not in ("succeeded", "failed", "cancelled"):
            unfinished.append(int(r.upstream_id))
    return found


MAX_EDGES = 10_000


def edges(conn: Connection, run_id: int, upstream: bool) -> dict[int, list[int]]:
    """The run's graph on one side: run -> its upstreams (or dependents), transitively, at
    most MAX_EDGES edges."""
    near, far = ("run_id", "upstream_id") if upstream else ("upstream_id", "run_id")
    rows = conn.execute(
        sql(
            "WITH RECURSIVE g(a, b) AS ("
            f" SELECT {near}, {far} FROM dtask_run_deps WHERE {near} = :id"
            f" UNION SELECT d.{near}, d.{far} FROM dtask_run_deps d JOIN g ON d.{near} = g.b)"
            " SELECT a, b FROM g LIMIT :limit"
        ),
        {"id": run_id, "limit": MAX_EDGES},
    ).all()
    found: dict[int, list[int]] = {}
    for r in rows:
        found.setdefault(int(r.a), []).append(int(r.b))
    return found


def nodes(conn: Connection, run_ids: Sequence[int]) -> dict[int, Node]:
    return {
        int(r.id): Node(int(r.id), r.template, RunState(r.state))
        for r in conn.execute(
            sql("SELECT id, template, state FROM dtask_runs WHERE id = ANY(:ids)"),
            {"ids": list(run_ids)},
        )
    }
