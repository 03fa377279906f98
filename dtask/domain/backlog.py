"""The backlog caps' rule: how many more runs a submit may create under DTASK_MAX_BACKLOG (per
queue, all its tiers) and DTASK_MAX_CLIENT_BACKLOG (per client), and which cap holds the rest.

The queue's cap is shared fairly, so one client filling a queue cannot make another `busy`:
while the queue holds fewer than its cap, anyone's submit fits; once it is full, a client's
still fits while the client holds less than its share, the cap divided equally among the
clients with unfinished runs in the queue (itself included; at least one run). The client
that filled the queue is the one refused. Those shares may take the queue past its cap, never
past ``CEILING`` times it: then every submit to it is refused."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

CEILING = 2  # a queue's unfinished runs never pass twice DTASK_MAX_BACKLOG (`busy` says so)


@dataclass(frozen=True)
class Backlog:
    """Unfinished runs (pending, splitting, running) as one client's submit sees them."""

    queue: int  # in the queue, all its tiers
    others: int  # clients other than this one with unfinished runs in the queue
    mine: int  # of the queue's, this client's
    client: int  # this client's, whatever the queue

    def added(self, created: int) -> Backlog:
        """The same once this client has created ``created`` more runs in the queue."""
        return replace(
            self,
            queue=self.queue + created,
            mine=self.mine + created,
            client=self.client + created,
        )


class Cap(Enum):
    """Which cap refused a submit."""

    QUEUE = "queue"  # the queue is full and the client holds its share of it or more
    CEILING = "ceiling"  # the queue holds CEILING times its cap
    CLIENT = "client"  # DTASK_MAX_CLIENT_BACKLOG


def share(cap: int, others: int) -> int:
    """A client's share of a queue's cap: the cap divided among the clients holding runs in
    it (``others`` and itself), at least one run."""
    return max(1, cap // (others + 1))


def room(
    seen: Backlog, queue_cap: int | None, client_cap: int | None, wanted: int
) -> tuple[int, Cap | None]:
    """How many of ``wanted`` more runs fit (0 to ``wanted``), and the cap that holds the
    rest back (None when all fit)."""
    rooms: list[tuple[int, Cap]] = []
    if queue_cap is not None:
        fair = max(queue_cap - seen.queue, share(queue_cap, seen.others) - seen.mine)
        rooms += [(fair, Cap.QUEUE), (CEILING * queue_cap - seen.queue, Cap.CEILING)]
    if client_cap is not None:
        rooms.append((client_cap - seen.client, Cap.CLIENT))
    if not rooms:
        return wanted, None
    least, cap = min(rooms, key=lambda r: r[0])
    if least >= wanted:
        return wanted, None
    return max(0, least), cap
