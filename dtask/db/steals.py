"""Straggler stealing in PostgreSQL (docs/elastic.md): the dispatcher asks a running range
child to give work away (``StealStore``); the child answers at its next checkpoint with
``give_away``: its range shrinks under its fence and the rest becomes a new child of the same
run, in one transaction, so no number is ever on two children or on none."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dtask.db.database import Database, lock_run, sql
from dtask.db.message_claims import COVERED, held
from dtask.db.queued import QUEUED
from dtask.domain.stealing import Running
from dtask.exceptions import LeaseLost


@dataclass(frozen=True)
class Gift:
    """The new child a steal made: its index and spec, and the run's chord as it is now."""

    index: int
    spec: dict[str, Any]
    template: str
    group_id: str | None
    chord_size: int


class _NotNow(Exception):
    """The run is no longer running (cancelled, finalizing): nothing is given away."""


def give_away(
    db: Database,
    child: tuple[int, int, int | None],
    run_id: int,
    keys: tuple[str, str],
    end: int,
    at: int,
    deferred: bool,
) -> Gift | None:
    """Cut ``[a, end]`` (``keys`` name a and b in the spec) at ``at``: this child keeps
    ``[a, at - 1]``, a new child gets ``[at, end]``. Under the run's lock (a cancel, rerun or
    finalize waits) and this child's fence (``child``: its id, fence, and the message whose
    claim covers it, if one does: the fence is the message's; LeaseLost if it moved). None
    when the run is no longer running. With ``deferred`` the new child waits for the
    dispatcher."""
    a_key, b_key = keys
    try:
        with db.tx() as conn:
            lock_run(conn, run_id)
            mine = conn.execute(
                sql(
                    "UPDATE dtask_children c"
                    " SET spec = jsonb_set(spec, ARRAY[:b], to_jsonb(:keep)), give_away = false,"
                    " cuts = cuts + 1, updated_at = now()"
                    f" WHERE c.id = :id AND {_HOLDS if child[2] is not None else _OWNS}"
                    " AND (spec->>:b)::bigint = :end AND (spec->>:a)::bigint < :at"
                    " RETURNING spec, cuts, max_attempts"
                ),
                dict(
                    id=child[0],
                    fence=child[1],
                    message=child[2],
                    a=a_key,
                    b=b_key,
                    keep=at - 1,
                    end=end,
                    at=at,
                ),
            ).first()
            if mine is None:
                raise LeaseLost(f"run {run_id}: a child's range changed under its fence")
            run = conn.execute(
                sql(
                    "UPDATE dtask_runs SET child_total = child_total + 1,"
                    " chord_size = chord_size + 1, unsent = unsent + :unsent, updated_at = now()"
                    " WHERE id = :id AND state = 'running'"
                    " RETURNING child_total - 1 AS new_index, template, group_id, chord_size"
                ),
                {"id": run_id, "unsent": 1 if deferred else 0},
            ).first()
            if run is None:
                raise _NotNow
            spec = {**mine.spec, a_key: at, b_key: end}
            conn.execute(
                sql(
                    "INSERT INTO dtask_children (run_id, index, spec, max_attempts, cuts, sent_at)"
                    " VALUES (:run, :index, CAST(:spec AS jsonb), :most, :cuts,"
                    " CASE WHEN :deferred THEN NULL ELSE now() END)"
                ),
                dict(
                    run=run_id,
                    index=run.new_index,
                    spec=json.dumps(spec),
                    most=mine.max_attempts,
                    cuts=mine.cuts,
                    deferred=deferred,
                ),
            )
    except _NotNow:
        return None
    return Gift(run.new_index, spec, run.template, run.group_id, run.chord_size)


# A child running under a claim of its own (its fence), or one its message's claim covers (the
# message's fence, the child still covered: message_claims.COVERED)
_OWNS = "fence = :fence AND state = 'running'"
_HOLDS = (
    f"{COVERED} AND EXISTS (SELECT 1 FROM dtask_messages m WHERE m.id = :message"
    " AND m.fence = :fence AND m.run_id = c.run_id AND c.index BETWEEN m.lo AND m.hi FOR UPDATE)"
)
# the messages a worker owns that still cover a child, by run: a slot each
MESSAGES = (
    "SELECT run_id, count(*)::int AS n FROM dtask_messages WHERE owner IS NOT NULL"
    " AND children > 0 GROUP BY run_id"
)
# a child that runs: under its own claim, or covered by a message a worker owns
_RUNS = f"c.state = 'running' OR ({held('c')})"


_CANDIDATE = (
    "c.run_id, c.index AS child_index, c.spec, c.checkpoint, c.cuts, r.template,"
    " extract(epoch FROM now() - c.started_at) AS seconds"
)


class StealStore:
    """The dispatcher's side: where slots are free and nothing waits, which running range
    children could give work away, and asking one."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def out(self) -> dict[str, int]:
        """The slots children take, by queue (None: the default): each child running or sent
        and not yet taken, and each message a worker owns as one (one pool process runs its
        children one after the other: counted by its children, a straggler with a message's
        tail behind it left no slot free). A running child asked and not yet answered counts
        twice (the child it is about to make); one a message covers, once (the statement
        would read every owned message's range)."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "SELECT coalesce(r.queue, '') AS queue, sum(o.n) AS n FROM ("
                    "  SELECT run_id, count(*) + count(*) FILTER (WHERE give_away) AS n"
                    "  FROM dtask_children WHERE state = 'running' GROUP BY run_id"
                    f"  UNION ALL SELECT run_id, n FROM ({QUEUED}) q"
                    f"  UNION ALL SELECT run_id, n FROM ({MESSAGES}) h) o"
                    " JOIN dtask_runs r ON r.id = o.run_id WHERE r.state = 'running' GROUP BY 1"
                )
            ).all()
        return {r.queue: int(r.n) for r in rows}

    def candidates(self, queue: str | None, keys: Mapping[str, tuple[str, str]]) -> list[Running]:
        """The running children of ``queue``'s running runs of the templates in ``keys``
        (template -> the spec's a and b) that nothing waits behind (no unsent or pending
        child in their run), not asked yet, with their progress."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "WITH r AS (SELECT id, template FROM dtask_runs r"
                    "  WHERE r.state = 'running' AND r.unsent = 0"
                    "  AND coalesce(r.queue, '') = coalesce(:queue, '')"
                    "  AND r.template = ANY(:templates)"
                    # nothing queued: no child sent alone and not taken, no message not taken
                    "  AND NOT EXISTS (SELECT FROM dtask_children p"
                    "   WHERE p.run_id = r.id AND p.state = 'pending' AND p.sent_at IS NOT NULL)"
                    "  AND NOT EXISTS (SELECT FROM dtask_messages q"
                    "   WHERE q.run_id = r.id AND q.claimed_at IS NULL))"
                    f" SELECT {_CANDIDATE} FROM r JOIN dtask_children c ON c.run_id = r.id"
                    " WHERE c.state = 'running' AND NOT c.give_away"
                    # and those owned messages cover, through each one's range
                    f" UNION ALL SELECT {_CANDIDATE} FROM r"
                    " JOIN dtask_messages m ON m.run_id = r.id AND m.owner IS NOT NULL"
                    " JOIN dtask_children c ON c.run_id = r.id AND c.index BETWEEN m.lo AND m.hi"
                    f" WHERE {COVERED} AND NOT c.give_away"
                ),
                {"queue": queue, "templates": list(keys)},
            ).all()
        found = []
        for r in rows:
            a_key, b_key = keys[r.template]
            a, b = r.spec.get(a_key), r.spec.get(b_key)
            done = r.checkpoint.get("done") if isinstance(r.checkpoint, dict) else 0
            if not (isinstance(a, int) and isinstance(b, int) and isinstance(done, int)):
                continue
            seconds = float(r.seconds or 0)
            found.append(Running(r.run_id, r.child_index, a, b, done, seconds, r.cuts))
        return found

    def ask(self, run_id: int, index: int) -> bool:
        """Ask the child to give work away at its next checkpoint (if it still runs)."""
        with self.db.tx() as conn:
            result = conn.execute(
                sql(
                    "UPDATE dtask_children c SET give_away = true"
                    f" WHERE c.run_id = :run AND c.index = :index AND ({_RUNS})"
                ),
                {"run": run_id, "index": index},
            )
        return result.rowcount == 1
