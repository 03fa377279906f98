"""The dispatch rule: which waiting children go into the broker's bounded window next.

Pure: the dispatcher (dtask/worker/dispatcher.py) reads the runs with unsent children from
PostgreSQL, asks :func:`plan` how many of each to send, and sends them.

Order, per free place in the window:
1. priority, highest first;
2. within a priority, earliest deadline first (runs without a deadline after those with one);
3. then weighted fair share between clients, by stride scheduling: each child sent adds
   ``1 / weight`` to its client's *pass*, and the client with the lowest pass goes next; a
   client that (re)appears starts at the lowest pass of those waiting, so it neither starves
   the others nor is starved by their past;
4. then the same between the runs of one client (equal weights), then the lower run id.

A client at its ``max_running`` (children running or in the broker) is skipped.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime


@dataclass(frozen=True)
class Demand:
    """A run with children waiting in PostgreSQL."""

    run_id: int
    client: str
    priority: int
    deadline: datetime | None
    unsent: int  # children not yet sent
    child_seconds: float | None = None  # a child's measured time (None: none finished yet)
    template: str = ""
    total: int = 0  # the run's children


def runnable(template: str, known: Iterable[tuple[str, ...] | None]) -> bool:
    """Whether a queue's live workers (the templates each knows, None where one did not say)
    can run ``template``. Yes where none is live: the broker keeps the messages for the first
    to come. No where all of them say they do not know it (a rolling deploy took it away):
    its children would only circle between them, holding the queue's window."""
    workers = list(known)
    return not workers or any(t is None or template in t for t in workers)


@dataclass(frozen=True)
class Share:
    """A client's part in the rule: its weight, its cap, what it has out now."""

    weight: float = 1.0
    max_running: int | None = None
    in_flight: int = 0  # its children running or in the broker

    @property
    def room(self) -> float:
        return math.inf if self.max_running is None else max(0, self.max_running - self.in_flight)


@dataclass
class Passes:
    """The fair-share state the dispatcher keeps between plans: one pass per client and per
    run. Forgetting it (a new dispatcher after a hand-off) only restarts the sharing."""

    clients: dict[str, float] = field(default_factory=dict)
    runs: dict[int, float] = field(default_factory=dict)

    def forget_except(self, clients: Iterable[str], runs: Iterable[int]) -> None:
        keep_c, keep_r = set(clients), set(runs)
        self.clients = {c: p for c, p in self.clients.items() if c in keep_c}
        self.runs = {r: p for r, p in self.runs.items() if r in keep_r}


def window(
    slots: int,
    finished_per_second: float,
    interval: float,
    override: int | None,
    batch: int = 1,
) -> int:
    """K, the children a queue may hold: two messages of ``batch`` per live slot (one
    running, one next), plus what the slots finish between two dispatcher passes, twice over,
    so fast children never wait for a pass; ``override`` (DTASK_DISPATCH_WINDOW) replaces the
    rule. No slot: nothing."""
    if override is not None:
        return override
    if slots <= 0:
        return 0
    return 2 * slots * batch + math.ceil(2 * finished_per_second * interval)


SMALL_RUN_CHILDREN = 100  # a run this small goes ahead of large ones (broker level, first child)
BATCH_SECONDS = 0.05  # a message's work when a run's children are short: what a new run's
# first child may wait for a pool process busy with a large run's message
MAX_BATCH = 400  # children per message at most: each message costs the worker its ack, events
# and a claim, a write and a note of its time in PostgreSQL (bench/notes.md: 100 -> 400)


def batch_size(child_seconds: float | None) -> int:
    """Children of a run per message, from how long its finished children took (None: none
    has finished yet): as many as fill ``BATCH_SECONDS``, so no child waits behind another for
    longer than that; one when a child alone takes that long."""
    if child_seconds is None or child_seconds >= BATCH_SECONDS:
        return 1
    return max(1, min(MAX_BATCH, int(BATCH_SECONDS / max(child_seconds, 1e-6))))


# A message of children is cut where its body would pass this: 400 children of specs near
# DTASK_MAX_CHILD_SPEC (64 KiB) made 25 MiB, past RabbitMQ 4's default max_message_size (16 MiB:
# the publish fails, and so does every re-send of it), and held as one in a worker's memory.
MESSAGE_BYTES = 1 << 20
# what a message's body holds besides its children's specs: its run, template, group and
# queue, and each child's index and brackets
MESSAGE_FRAME, CHILD_FRAME = 4096, 16


def messages(spec_bytes: Sequence[int], batch: int) -> list[int]:
    """How many consecutive children of one run go to each message: ``batch`` at most, and no
    more than fit MESSAGE_BYTES by their specs' JSON sizes (a lone child goes as it is: its
    spec is bounded by DTASK_MAX_CHILD_SPEC)."""
    room = MESSAGE_BYTES - MESSAGE_FRAME
    sizes: list[int] = []
    count = used = 0
    for size in spec_bytes:
        if count and (count >= batch or used + size + CHILD_FRAME > room):
            sizes.append(count)
            count = used = 0
        count += 1
        used += size + CHILD_FRAME
    if count:
        sizes.append(count)
    return sizes


def plan(
    demands: Iterable[Demand], shares: dict[str, Share], free: int, passes: Passes
) -> dict[int, int]:
    """How many children of each run to send now (run id -> count), ``free`` at most."""
    waiting = [d for d in demands if d.unsent > 0]
    if free <= 0 or not waiting:
        return {}
    _enter(passes.clients, {d.client for d in waiting})
    by_client: dict[str, list[Demand]] = {}
    for d in waiting:
        by_client.setdefault(d.client, []).append(d)
    for runs in by_client.values():
        _enter(passes.runs, {d.run_id for d in runs})
    left = {d.run_id: d.unsent for d in waiting}
    room = {c: shares.get(c, Share()).room for c in by_client}
    weight = {c: shares.get(c, Share()).weight for c in by_client}
    # The rule picks the least (priority, deadline, client pass, run pass, run id). A client's
    # pass is the same for all its runs, so each client's best run is the head of its own heap
    # of (priority, deadline, run pass, run id), and the next child is the best of those
    # heads: a heap of clients over a heap of runs each, O(log runs) a child, not O(runs).
    own: dict[str, list[tuple[int, float, float, int]]] = {}
    for client, runs in by_client.items():
        if room[client] > 0:
            own[client] = [_run_key(d, passes) for d in runs]
            heapq.heapify(own[client])
    heads = [_client_key(c, h[0], passes) for c, h in own.items()]
    heapq.heapify(heads)
    sent: dict[int, int] = {}
    while free > 0 and heads:
        client = heapq.heappop(heads)[5]
        heap = own[client]
        priority, deadline, _, run_id = heapq.heappop(heap)
        sent[run_id] = sent.get(run_id, 0) + 1
        left[run_id] -= 1
        room[client] -= 1
        free -= 1
        passes.clients[client] += 1 / weight[client]
        passes.runs[run_id] += 1
        if left[run_id] > 0:
            heapq.heappush(heap, (priority, deadline, passes.runs[run_id], run_id))
        if heap and room[client] > 0:
            heapq.heappush(heads, _client_key(client, heap[0], passes))
    return sent


def plan_with_newcomers(
    demands: Iterable[Demand], shares: dict[str, Share], free: int, overrun: int, passes: Passes
) -> dict[int, int]:
    """``plan``, then one child each for the small runs this dispatcher has sent nothing yet
    and that ``plan`` left out (the window was full), ``overrun`` of them at most, however
    full: a short job's first child does not wait for a large run's queued messages to drain.
    What that adds to the broker is bounded by how fast runs are split (a pass per split, and
    ``overrun`` per pass); the rest of every run waits for the window. Large runs get no such
    lane: between them the window's fair share alone decides (an extra child to a newcomer
    in each dispatcher's pass tilted two clients' share to 61/39)."""
    demands = list(demands)
    new = [
        d
        for d in demands
        if d.run_id not in passes.runs and d.unsent > 0 and d.total <= SMALL_RUN_CHILDREN
    ]
    sent = plan(demands, shares, free, passes)
    extra = overrun
    rest = [replace(d, unsent=1) for d in new if d.run_id not in sent]
    if extra <= 0 or not rest:
        return sent
    taken: Counter[str] = Counter()
    client = {d.run_id: d.client for d in demands}
    for run_id, count in sent.items():
        taken[client[run_id]] += count
    after = {c: replace(s, in_flight=s.in_flight + taken[c]) for c, s in shares.items()}
    for run_id, count in plan(rest, after, extra, passes).items():
        sent[run_id] = sent.get(run_id, 0) + count
    return sent


def _enter(passes: dict[str, float] | dict[int, float], present: set[object]) -> None:
    """Give newcomers the lowest pass among those already waiting (0 when none are)."""
    known = [p for k, p in passes.items() if k in present]
    start = min(known, default=0.0)
    for key in present:
        passes.setdefault(key, start)  # type: ignore[arg-type]


def _run_key(d: Demand, passes: Passes) -> tuple[int, float, float, int]:
    deadline = d.deadline.timestamp() if d.deadline is not None else math.inf
    return (-d.priority, deadline, passes.runs[d.run_id], d.run_id)


def _client_key(
    client: str, head: tuple[int, float, float, int], passes: Passes
) -> tuple[int, float, float, float, int, str]:
    """The rule's order of a client's best run (its run id breaks every tie: the client's
    name at the end is never compared)."""
    priority, deadline, run_pass, run_id = head
    return (priority, deadline, passes.clients[client], run_pass, run_id, client)
