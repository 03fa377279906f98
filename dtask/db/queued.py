"""Children out in the broker and not yet taken by a worker: *queued*.

Two kinds: a child sent on its own (a lone child, a retry, a re-send, a hand-over, every child
of ``DTASK_DISPATCH=all``) is pending with its ``sent_at`` set; a child the dispatcher sent in
a message of several is not written when it is sent: its message's row in ``dtask_messages``
counts it until a worker takes the message (``claimed_at``). Every reader of what is queued
reads ``QUEUED``: the dispatcher's window, stealing's free slots, ``dtask why``, the reaper.
"""

from __future__ import annotations


def queued(overdue: bool = False) -> str:
    """Per run (a row or two): how many of its children are queued (``n``), and with
    ``overdue`` how many of them were sent over ``:stall`` seconds ago; the first arm through
    the (run_id) index of pending children sent, the second through the (sent_at) index of
    messages not taken (both partial: they hold only what is out)."""
    late = "sent_at < now() - make_interval(secs => :stall)"
    return (
        "SELECT run_id, count(*) AS n"
        + (f", count(*) FILTER (WHERE {late}) AS overdue" if overdue else "")
        + " FROM dtask_children WHERE state = 'pending' AND sent_at IS NOT NULL GROUP BY run_id"
        " UNION ALL SELECT run_id, sum(children)"
        + (f", coalesce(sum(children) FILTER (WHERE {late}), 0)" if overdue else "")
        + " FROM dtask_messages WHERE claimed_at IS NULL GROUP BY run_id"
    )


QUEUED = queued()


def unsent(mark: str) -> str:
    """SQL true of a child waiting in PostgreSQL for the dispatcher, given its run's mark
    (``mark``, an SQL expression): pending, never sent alone, not taken in a message."""
    return f"state = 'pending' AND sent_at IS NULL AND index >= {mark}"


# Per run, the children running under their messages' claims (``message_claims``): pending in
# their rows, covered by a message a worker owns. Every reader of what runs adds these to the
# children running under claims of their own (``state = 'running'``).
HELD = (
    "SELECT run_id, sum(children)::int AS n FROM dtask_messages WHERE owner IS NOT NULL"
    " GROUP BY run_id"
)


def held(run: str) -> str:
    """SQL: how many children of run ``run`` (an SQL expression) run in owned messages."""
    return (
        "(SELECT coalesce(sum(children), 0)::int FROM dtask_messages"
        f" WHERE run_id = {run} AND owner IS NOT NULL)"
    )


def as_running(states: dict[str, int], held: int) -> None:
    """Children counted by their rows' states (``states``, changed in place): ``held`` of the
    pending ones run under their messages' claims."""
    if held:
        states["pending"] = states.get("pending", 0) - held
        states["running"] = states.get("running", 0) + held


# A worker took the message of run ``:run`` that starts at child ``:lo`` (a copy of it, or a
# message that is not the dispatcher's, finds it taken, or no row): a CTE of the claim
SEEN = (
    "UPDATE dtask_messages SET claimed_at = now()"
    " WHERE run_id = :run AND lo = :lo AND claimed_at IS NULL"
)
