"""A window message's claim: one row per message, not per child (docs/design/message-claims.md).

A worker that takes a message the dispatcher sent (its row in ``dtask_messages``, found by its
run and first child) moves the row's fence and owns it under a lease; the children stay as
the split wrote them, pending and unsent, *covered* by the message (in its range, pending,
``sent_at`` NULL). Each child's end is written once, under the message's fence: a success,
a failure, a hand-back. Whatever takes a child out of its message sets ``sent_at`` or ends it,
so coverage needs no list. ``children`` counts the children the message still covers: the
dispatcher's running count.

A message is claimed once. Its row let go (its end, its lease expired) moves the fence again
and re-sends each child it still covers on its own, a row claim from then on.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Row

from dtask.db.database import ASYNC_COMMIT, DISPATCH_LOCK, sql

_LEASE = "now() + make_interval(secs => :ttl)"

# A child a message's claim covers, in a statement where ``m`` is the message's row (``run``,
# ``lo``, ``hi``)
_IN_RANGE = "c.run_id = m.run AND c.index BETWEEN m.lo AND m.hi"
# Its state is not an index's column here: from statistics older than its run, the planner
# read every unsent child of the run through an index of pending children (their ``sent_at``),
# taking them for none; so only the keys fit, (id) and (run_id, index), as a message's
# statements name them
COVERED = "c.state || '' = 'pending' AND c.sent_at IS NULL"


def held(c: str) -> str:
    """SQL true of child ``c`` (a table or its alias) while a message a worker owns covers
    it: it runs under that message's claim, pending in its row."""
    return (
        f"{c}.state = 'pending' AND {c}.sent_at IS NULL AND EXISTS (SELECT 1 FROM dtask_messages m"
        f" WHERE m.run_id = {c}.run_id AND m.owner IS NOT NULL"
        f" AND {c}.index BETWEEN m.lo AND m.hi)"
    )


_COVERS = (
    "c.run_id = :run AND c.index BETWEEN :lo AND :hi"
    f" AND c.index = ANY(:indexes) AND {COVERED} AND c.attempt < c.max_attempts"
)


# A child ``c`` as people read it: one a message's claim covers is running, its owner the
# message's (``h.holder``)
HOLDER = (
    " LEFT JOIN LATERAL (SELECT m.owner AS holder FROM dtask_messages m"
    " WHERE m.run_id = c.run_id AND m.owner IS NOT NULL AND m.lo <= c.index AND m.hi >= c.index"
    " AND c.state = 'pending' AND c.sent_at IS NULL LIMIT 1) h ON true"
)
SHOWN_STATE = "CASE WHEN h.holder IS NULL THEN c.state ELSE 'running' END"


def held_ranges(conn: Connection, run: int) -> list[tuple[int, int]]:
    """The ranges of the run's owned messages (the children they cover run)."""
    rows = conn.execute(
        sql("SELECT lo, hi FROM dtask_messages WHERE run_id = :r AND owner IS NOT NULL"),
        {"r": run},
    ).all()
    return [(int(r.lo), int(r.hi)) for r in rows]


def claim(conn: Connection, run: int, indexes: list[int], owner: str, ttl: float) -> list[Row[Any]]:
    """Take the dispatcher's message of ``run`` that starts at ``min(indexes)`` and ends at
    ``max(indexes)``, if it was sent and never taken while its run is active: its row's fence
    moves to 1, its lease is ``owner``'s (a message of another range, as a copy sent before a
    rerun's rows, does not take it: its children are claimed one by one). One row per child
    of ``indexes`` it covers with an attempt left (``position``, the child's columns, the
    message's ``message`` and ``fence``), or one row with a NULL ``id`` if it covers none; no
    row when there is no such message."""
    return list(
        conn.execute(
            sql(
                "WITH m AS (UPDATE dtask_messages SET fence = fence + 1, owner = :owner,"
                f" claimed_at = now(), lease_expires_at = {_LEASE},"
                f" children = (SELECT count(*) FROM dtask_children c WHERE {_COVERS})"
                " WHERE run_id = :run AND lo = :lo AND hi = :hi AND claimed_at IS NULL"
                " AND EXISTS (SELECT 1 FROM dtask_runs r WHERE r.id = :run"
                "   AND r.state IN ('splitting', 'running'))"
                " RETURNING id, fence)"
                " SELECT m.id AS message, m.fence, c.index AS position, c.id, c.attempt,"
                " c.max_attempts, c.spec, c.checkpoint,"
                " (SELECT r.execution_cap FROM dtask_runs r WHERE r.id = :run) AS cap"
                f" FROM m LEFT JOIN dtask_children c ON {_COVERS}"
            ),
            {
                "run": run,
                "indexes": indexes,
                "lo": min(indexes),
                "hi": max(indexes),
                "owner": owner,
                "ttl": ttl,
            },
        ).all()
    )


def after_pass(conn: Connection) -> None:
    """Wait for the dispatcher's pass in progress, if any, to end. A claim that found no row
    may have raced its message's commit: a pass publishes in its transaction (so passes
    publish in the order they take), and an UPDATE does not wait on a row inserted and not
    yet committed. On RabbitMQ such a message was claimed child by child, and its row,
    committed after, looked queued until the reaper's stall timeout. Costs a statement only
    where no row was found (a hand-over's message, a copy)."""
    conn.execute(sql("SELECT pg_advisory_xact_lock_shared(:ns, 0)"), {"ns": DISPATCH_LOCK})


# The message row of a claim ``:message`` under its fence ``:fence``, locked: a concurrent let
# go (the reaper's) waits, or has already moved the fence and this write matches nothing
_HELD = (
    "m AS (SELECT id AS message_id, owner AS holder, run_id AS run, lo, hi FROM dtask_messages"
    " WHERE id = :message AND fence = :fence FOR UPDATE)"
)


def _keep(ttl: float | None) -> str:
    """The message row after a write of its children ``w`` (those that left it counted out),
    its lease renewed when ``ttl`` is given."""
    lease = f", lease_expires_at = {_LEASE}" if ttl is not None else ""
    return (
        "kept AS (UPDATE dtask_messages SET children = children"
        " - (SELECT count(*) FROM w WHERE w.left_message)"
        f"{lease} WHERE id = (SELECT message_id FROM m))"
    )


def write(
    conn: Connection,
    message: int,
    fence: int,
    child: int,
    assignments: str,
    ttl: float | None = None,
    durable: bool = False,
    **params: Any,
) -> Row[Any] | None:
    """``assignments`` to a child its message's claim covers, under the message's fence (the
    child's owner is the message's: ``m.holder``); None when the fence moved or the child is
    no longer covered. A write that takes the child out of its message counts it out."""
    commit = "" if durable else f" AND {ASYNC_COMMIT}"
    return conn.execute(
        sql(
            f"WITH {_HELD},"
            f" w AS (UPDATE dtask_children c SET {assignments}, updated_at = now() FROM m"
            f" WHERE c.id = :id AND {_IN_RANGE} AND {COVERED}{commit}"
            " RETURNING c.give_away, c.run_id, c.index, c.worker, c.state,"
            " (c.state <> 'pending' OR c.sent_at IS NOT NULL) AS left_message),"
            f" {_keep(ttl)}"
            " SELECT give_away, run_id, index, worker, state FROM w"
        ),
        {"message": message, "fence": fence, "id": child, "ttl": ttl, **params},
    ).first()


def finish_many(
    conn: Connection, message: int, fence: int, values: str, assignments: str, ttl: float,
    params: dict[str, Any], next_child: int | None = None,
) -> tuple[set[int], bool]:  # fmt: skip
    """Several children's successes (``values``: the CTE ``v`` of them, ``assignments`` from
    it) under their message's fence, its lease renewed: the ids written, and whether the
    message is still held (and covers ``next_child``, the one that starts now, if any)."""
    row = conn.execute(
        sql(
            f"WITH {values}, {_HELD},"
            f" w AS (UPDATE dtask_children c SET {assignments}, updated_at = now(),"
            "   started_at = coalesce(c.started_at, now()) FROM v, m"
            # through the index of the unsent and covered children, the message's range
            # only: with statistics older than the run, the planner read all of its unsent
            f"   WHERE {_IN_RANGE} AND c.id = v.id"
            f"   AND {COVERED}"
            "   RETURNING c.id, true AS left_message),"
            f" {_keep(ttl)}"
            " SELECT ARRAY(SELECT id FROM w) AS finished,"
            # the next child starts only if the message is held and covers it still
            " EXISTS (SELECT 1 FROM m WHERE CAST(:next AS bigint) IS NULL OR EXISTS"
            f"   (SELECT 1 FROM dtask_children c WHERE c.id = :next AND {_IN_RANGE}"
            f"   AND {COVERED})) AS held"
            f" WHERE {ASYNC_COMMIT}"
        ),
        {**params, "message": message, "fence": fence, "ttl": ttl, "next": next_child},
    ).one()
    return set(row.finished), bool(row.held)


def renew(conn: Connection, message: int, fence: int, child: int, ttl: float) -> str | None:
    """A covered child's heartbeat: its message's lease from now; the run's state, or None
    when the fence moved or the child left its message."""
    return conn.execute(
        sql(
            f"UPDATE dtask_messages m SET lease_expires_at = {_LEASE} FROM dtask_runs r"
            " WHERE m.id = :message AND m.fence = :fence AND r.id = m.run_id"
            " AND EXISTS (SELECT 1 FROM dtask_children c WHERE c.id = :id"
            f"   AND c.run_id = m.run_id AND c.index BETWEEN m.lo AND m.hi AND {COVERED})"
            f" AND {ASYNC_COMMIT} RETURNING r.state"
        ),
        {"message": message, "fence": fence, "id": child, "ttl": ttl},
    ).scalar()


def _let_go(conn: Connection, found: Row[Any]) -> list[Row[Any]]:
    """Let go of the message ``found`` (its id, fence, run, range, when its lease ended) if its
    fence has not moved: it owns nothing from now, and each child it still covers is out on
    its own (``sent_at``); those children, with what re-sends them. The range is given as
    values, not read from the row in the statement: from a row, the planner read every child
    of the run (from the run's statistics) for each message let go."""
    return list(
        conn.execute(
            sql(
                "WITH let AS (UPDATE dtask_messages SET fence = fence + 1, owner = NULL,"
                " lease_expires_at = NULL, children = 0 WHERE id = :message AND fence = :fence"
                " RETURNING id)"
                " UPDATE dtask_children c SET sent_at = now(), updated_at = now() FROM let,"
                " dtask_runs r"
                f" WHERE c.run_id = :run AND c.index BETWEEN :lo AND :hi AND {COVERED}"
                " AND r.id = :run"
                " RETURNING c.run_id, c.index, c.spec, r.template, r.group_id, r.queue,"
                " r.state = 'running' AS resend,"
                " extract(epoch FROM now() - CAST(:expired AS timestamptz)) AS overdue"
            ),
            {
                "message": found.id,
                "fence": found.fence,
                "run": found.run_id,
                "lo": found.lo,
                "hi": found.hi,
                "expired": found.expired,
            },
        ).all()
    )


_FOUND = "SELECT id, fence, run_id, lo, hi, {expired} AS expired FROM dtask_messages"


def close(conn: Connection, message: int, fence: int) -> list[Row[Any]]:
    """The message's end, by its owner: let go of it; the children it still covers (none when
    each one's end was written) are returned, to be sent again."""
    found = conn.execute(
        sql(f"{_FOUND.format(expired='now()')} WHERE id = :message AND fence = :fence"),
        {"message": message, "fence": fence},
    ).first()
    return [] if found is None else _let_go(conn, found)


def expire(conn: Connection, limit: int) -> list[Row[Any]]:
    """The reaper (in its transaction): let go of owned messages whose lease expired (their
    owner died, hung or was cut off); their covered children, to be re-sent."""
    gone = conn.execute(
        sql(
            f"{_FOUND.format(expired='lease_expires_at')}"
            " WHERE owner IS NOT NULL AND lease_expires_at < now()"
            " ORDER BY lease_expires_at LIMIT :limit FOR UPDATE SKIP LOCKED"
        ),
        {"limit": limit},
    ).all()
    return [row for found in gone for row in _let_go(conn, found)]
