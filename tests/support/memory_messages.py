"""The in-memory store's message claims (dtask/db/message_claims.py): a message the
dispatcher sent, taken for the first time, is claimed as one row; the children it covers stay
pending and unsent, written under its fence as each one ends; letting it go (its end, its
lease expired) moves the fence and sends each child it still covers on its own."""

from __future__ import annotations

from dtask.db import Claim, Redispatch
from dtask.domain.runs import ChildState, RunState
from tests.support.memory_rows import ChildRow, MessageRow, Tables, jsonb


def claim(t: Tables, run_id: int, indexes: list[int], owner: str, ttl: float) -> (
    tuple[MessageRow, list[ChildRow]] | None
):  # fmt: skip
    """The dispatcher's message starting at ``min(indexes)``, sent and never taken while its
    run is active, now ``owner``'s; the children of ``indexes`` it covers with an attempt
    left. None: no such message."""
    m = t.messages.get((run_id, min(indexes)))
    if m is None or m.hi != max(indexes) or m.claimed_at is not None or not t.active(run_id):
        return None
    now = t.clock()
    covered = [
        row
        for index in sorted(set(indexes))
        if (row := t.child(run_id, index)) is not None
        and row.state is ChildState.PENDING
        and row.sent_at is None
        and m.lo <= index <= m.hi
        and row.attempt < row.max_attempts
    ]
    m.fence, m.owner, m.claimed_at, m.lease_expires_at = m.fence + 1, owner, now, now + ttl
    m.children = len(covered)
    return m, covered


def holds(t: Tables, row: ChildRow, claim: Claim) -> bool:
    """A covered child's fenced writes' WHERE: its message's fence, the child still covered."""
    m = t.message(claim.message)
    return (
        m is not None
        and m.fence == claim.fence
        and m.run_id == row.run_id
        and m.lo <= row.index <= m.hi
        and row.state is ChildState.PENDING
        and row.sent_at is None
    )


def left(t: Tables, row: ChildRow, claim: Claim, ttl: float | None = None) -> None:
    """After a covered child's write: counted out of its message if it left it; the
    message's lease renewed with ``ttl``."""
    m = t.message(claim.message)
    if m is None:
        return
    if row.state is not ChildState.PENDING or row.sent_at is not None:
        m.children -= 1
    if ttl is not None:
        m.lease_expires_at = t.clock() + ttl


def let_go(t: Tables, m: MessageRow) -> list[Redispatch]:
    """The message owns nothing from now; the children it still covers are out on their own:
    those of a running run, to be re-sent."""
    covered = [
        row
        for row in t.of_run(m.run_id)
        if m.lo <= row.index <= m.hi and row.state is ChildState.PENDING and row.sent_at is None
    ]
    m.fence, m.owner, m.lease_expires_at, m.children = m.fence + 1, None, None, 0
    now = t.clock()
    for row in covered:
        row.sent_at = now
    run = t.runs[m.run_id]
    if run.state is not RunState.RUNNING:
        return []
    return [
        Redispatch(row.run_id, row.index, jsonb(row.spec), run.template, run.group_id or "",
                   run.queue)
        for row in covered
    ]  # fmt: skip


def expired(t: Tables) -> list[MessageRow]:
    now = t.clock()
    return [
        m
        for m in t.messages.values()
        if m.owner is not None and m.lease_expires_at is not None and m.lease_expires_at < now
    ]
