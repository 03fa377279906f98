"""Concurrency keys in PostgreSQL (:mod:`dtask.domain.concurrency`). A run with a key is
inserted ``waiting`` and admitted (moved to ``pending``: its master is the caller's to send)
while fewer than its ``max_concurrent`` runs of its client and key are unfinished; a run of
the key that finishes admits the next waiting ones, oldest first.

Exact across workers: an admission holds a transaction-scoped advisory lock per (client, key),
so two never count at once, and each counts what the previous one committed. The locks are
taken last in their transaction, in one order, and admission locks waiting runs with SKIP
LOCKED: it never waits on a row, so no two transactions wait on each other in a cycle. A
waiting run it skips is locked by a transaction that admits it itself (the settle of its last
upstream), or ends without changing it; the reaper's pass admits what nobody did."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection

from dtask.db.database import KEY_LOCKS, sql

Key = tuple[str, str]  # (client, concurrency key)

ACTIVE = "('pending', 'splitting', 'running')"
# its upstreams (if any) all succeeded: only its key holds it
_FREE_OF_UPSTREAMS = (
    "NOT EXISTS (SELECT 1 FROM dtask_run_deps d JOIN dtask_runs u ON u.id = d.upstream_id"
    " WHERE d.run_id = r.id AND u.state <> 'succeeded')"
)
_NEXT = 100  # waiting runs of a key one admission reads at most


def key_of(row: Any) -> Key | None:
    """The key of a run's row (its ``client`` and ``concurrency_key`` columns), if it has one."""
    return (str(row.client), str(row.concurrency_key)) if row.concurrency_key else None


def _name(key: Key) -> str:
    return json.dumps(key)


def admit(conn: Connection, keys: Iterable[Key]) -> list[int]:
    """Of the waiting runs of ``keys`` that wait only for their key, the oldest that fit
    under its limit moved to pending (their ids returned). Holds the keys' locks until the
    commit."""
    wanted = sorted(set(keys))
    if not wanted:
        return []
    conn.execute(
        sql(
            "SELECT count(pg_advisory_xact_lock(:ns, h)) FROM (SELECT DISTINCT hashtext(k) AS h"
            " FROM unnest(CAST(:keys AS text[])) k ORDER BY h) s"
        ),
        {"ns": KEY_LOCKS, "keys": [_name(k) for k in wanted]},
    )
    admitted: list[int] = []
    for client, key in wanted:
        rows = conn.execute(
            sql(
                "WITH a AS (SELECT count(*) AS n FROM dtask_runs WHERE client = :client"
                f"  AND concurrency_key = :key AND state IN {ACTIVE})"
                " SELECT r.id, r.max_concurrent, a.n FROM dtask_runs r, a"
                " WHERE r.client = :client AND r.concurrency_key = :key AND r.state = 'waiting'"
                f" AND {_FREE_OF_UPSTREAMS}"
                " ORDER BY r.id LIMIT :most FOR UPDATE OF r SKIP LOCKED"
            ),
            {"client": client, "key": key, "most": _NEXT},
        ).all()
        running = rows[0].n if rows else 0
        for r in rows:  # in order: a run whose own limit is reached holds those behind it
            if running >= r.max_concurrent:
                break
            admitted.append(int(r.id))
            running += 1
    if admitted:
        conn.execute(
            sql(
                "UPDATE dtask_runs SET state = 'pending', updated_at = now()"
                " WHERE id = ANY(:ids) AND state = 'waiting'"
            ),
            {"ids": admitted},
        )
    return sorted(admitted)


def waiting_keys(conn: Connection, run_ids: Sequence[int] | None, limit: int = _NEXT) -> list[Key]:
    """Keys with a run that waits only for its key: among ``run_ids``, or any (the reaper
    admits what it can of them), ``limit`` at most."""
    if run_ids is not None and not run_ids:
        return []
    return [
        (str(r.client), str(r.concurrency_key))
        for r in conn.execute(
            sql(
                "SELECT DISTINCT client, concurrency_key FROM dtask_runs r"
                " WHERE concurrency_key IS NOT NULL AND state = 'waiting'"
                " AND (CAST(:ids AS bigint[]) IS NULL OR id = ANY(:ids))"
                f" AND {_FREE_OF_UPSTREAMS} LIMIT :limit"
            ),
            {"ids": None if run_ids is None else list(run_ids), "limit": limit},
        )
    ]


def holding(conn: Connection, key: Key) -> tuple[int, list[int]]:
    """How many runs of ``key`` are unfinished now, and the first few of them (for why a run
    waits)."""
    rows = conn.execute(
        sql(
            "SELECT id, count(*) OVER () AS n FROM dtask_runs WHERE client = :client"
            f" AND concurrency_key = :key AND state IN {ACTIVE} ORDER BY id LIMIT 5"
        ),
        {"client": key[0], "key": key[1]},
    ).all()
    return (rows[0].n if rows else 0), [int(r.id) for r in rows]
