"""The dispatcher (DTASK_DISPATCH=window): children wait in PostgreSQL, and one dispatcher at
a time keeps each queue's window in the broker filled, in the order of
``dtask.domain.dispatch.plan``.

A thread in every `dtask worker` main process tries a pass every DTASK_DISPATCH_INTERVAL
while children wait (every ten intervals otherwise); the pass runs only where the
dispatcher's advisory lock is free, so one worker dispatches and any other takes over when it
dies. A master that has just split a run tries a pass at once, so a new run's first children
leave within milliseconds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

from dtask import services
from dtask.db import Redispatch
from dtask.domain.dispatch import Passes, batch_size, plan_with_newcomers, window
from dtask.domain.stealing import pick
from dtask.domain.templates import registry
from dtask.settings import Settings
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.loop import Loop
from dtask.worker.messages import Sender, broker_priority, send
from dtask.worker.presence import can_run

log = logging.getLogger("dtask.worker")


IDLE_GAP = 2.0  # seconds between passes with work waiting: longer is an idle queue


@dataclass
class Pace:
    """How fast a queue's messages are taken, from what the dispatcher saw between passes.
    A gap without passes (nothing waited) is not measured: the next run starts with the pace
    the queue last had, not with one decayed towards zero by the idle time."""

    at: float = 0.0
    expected: int = 0  # messages out after the last pass: queued then plus sent then
    per_second: float = 0.0

    def update(self, queued_now: int) -> float:
        now = time.monotonic()
        if self.at and now - self.at < IDLE_GAP:
            taken = max(0, self.expected - queued_now)
            rate = taken / max(now - self.at, 1e-3)
            self.per_second = 0.7 * self.per_second + 0.3 * rate
        self.at = now
        return self.per_second


@dataclass
class Dispatcher:
    """The state one process keeps between its passes (fair-share passes, paces, and its own
    broker connection: opening one per pass cost more than the pass's queries)."""

    passes: dict[str, Passes] = field(default_factory=dict)
    paces: dict[str, Pace] = field(default_factory=dict)
    sender: Sender = field(default_factory=Sender)
    pid: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def once(self, wait: float = 0.0) -> int | None:
        """One pass: how many runs have children waiting (0: nothing to do; the loop slows
        down), or None when another process holds the turn. A pass that fails drops the
        connection; the next opens a new one (so does a fork: :class:`Sender`)."""
        if self.pid != os.getpid():  # a forked child: its parent's pass may hold the lock
            self.pid, self.lock = os.getpid(), threading.Lock()
        with self.lock:
            try:
                return self._pass(self.sender, wait)
            except BaseException:
                self.sender.close()
                raise

    def _pass(self, sender: Sender, wait: float = 0.0) -> int | None:
        settings = services.current().settings
        store = services.store()
        with store.dispatch.turn(settings.lease_ttl, wait) as turn:
            if turn is None:
                return None
            demands = turn.demands()
            if not demands:
                return 0
            workers = turn.live_workers(settings.worker_seen_within)
            can = can_run(workers)
            queues_out, clients_out = turn.out(can)
            for queue, waiting in demands.items():
                name = queue or DEFAULT_QUEUE
                runs = [d for d in waiting if can(queue, d.template)]
                if not runs:
                    continue
                out = queues_out.get(queue)
                queued = out.queued if out else 0
                pace = self.paces.setdefault(name, Pace())
                slots = sum(w.slots for w in workers if name in w.queues)
                batches = {d.run_id: batch_size(d.child_seconds) for d in runs}
                measured = [batches[d.run_id] for d in runs if d.child_seconds is not None]
                size = window(
                    slots,
                    pace.update(queued),
                    settings.dispatch_interval,
                    settings.dispatch_window,
                    # the smallest measured: a queue's long children never get a short run's
                    # window (a new run, not measured yet, gets its first child below)
                    min(measured, default=1),
                )
                shares = turn.shares({d.client for d in runs}, clients_out)
                passes = self.passes.setdefault(name, Passes())
                passes.forget_except({d.client for d in runs}, {d.run_id for d in runs})
                queue_sent = 0
                of = {d.run_id: d for d in runs}
                # DTASK_DISPATCH_WINDOW is the operator's bound on the broker: no lane past it
                overrun = 0 if settings.dispatch_window is not None else slots
                counts = plan_with_newcomers(runs, shares, size - queued, overrun, passes)
                for run_id, count in counts.items():
                    messages = turn.take(run_id, count, batches[run_id])
                    level = broker_priority(of[run_id].priority, of[run_id].total)
                    sent = _send(sender, messages, level)
                    queue_sent += sent
                    # a client with runs in several queues: its cap counts them all
                    client = of[run_id].client
                    clients_out[client] = clients_out.get(client, 0) + sent
                pace.expected = queued + queue_sent
            return sum(len(runs) for runs in demands.values())


def _send(sender: Sender, messages: list[list[Redispatch]], level: int) -> int:
    """A pass's messages, published in its transaction: passes publish in the order they
    take, so a high-priority run's children stay ahead on a FIFO queue (RabbitMQ's). A
    worker's claim that comes before the commit waits for it (``ChildStore.claim_many``).
    A publish that fails is tried once more on a fresh connection (the loop's own may have
    gone stale); failing again, the pass rolls back and the next one takes them again."""
    try:
        return send(messages, level, through=sender.producer)
    except Exception:
        sender.close()
        return send(messages, level, through=sender.producer)


_here = Dispatcher()


NUDGE_WAIT = 0.1  # seconds a split waits for the turn: a pass takes milliseconds


def nudge() -> None:
    """A pass now, after a split, waiting briefly for a pass in progress elsewhere (the main
    process's loop): a new run's first children leave at once instead of at the next
    interval. Errors are left to the next pass."""
    try:
        _here.once(wait=NUDGE_WAIT)
    except Exception as exc:
        log.warning("dispatcher: pass after the split failed (the next pass sends): %s", exc)


def ask(settings: Settings) -> int:
    """Where a queue's live slots outnumber its children out (running, or sent and not yet
    taken), ask as many stragglers as there are free slots, the most work left first
    (``dtask.domain.stealing.pick``): each gives its rest's second half away at its next
    checkpoint. Asked after a pass, so children that could take a slot have been sent and
    count as out: a slot still free is one no waiting child can use (another queue's, or
    held by its client's cap). How many were asked."""
    store = services.store()
    out = store.steals.out()
    if not out:
        return 0
    keys = {name: k for name in registry.names() if (k := registry.get(name).range_keys())}
    if not keys:
        return 0
    workers = store.workers.live(settings.worker_seen_within)
    asked = 0
    for queue, busy in out.items():
        slots = sum(w.slots for w in workers if (queue or DEFAULT_QUEUE) in w.queues)
        free = slots - busy
        if free <= 0:
            continue
        candidates = store.steals.candidates(queue or None, keys)
        for _ in range(free):
            chosen = pick(candidates)
            if chosen is None:
                break
            candidates.remove(chosen)
            if store.steals.ask(chosen.run_id, chosen.index):
                asked += 1
                log.info(
                    "run %s child %s asked to give work away (%s of %s..%s done; %s free slots)",
                    chosen.run_id, chosen.index, chosen.done, chosen.a, chosen.b, free,
                )  # fmt: skip
    return asked


PASS_SLOT = "pass:dispatcher"
STEAL_SLOT = "pass:stealing"


def loop(settings: Settings) -> Loop:
    """One pass a dispatch interval in the whole cluster while passes find work, one in ten
    intervals while they find none, whatever the number of workers: a pass first takes the
    cluster's next slot (one statement), and a pass that found nothing puts the next slot ten
    intervals away. The others find the slot taken and ask again at the slow pace (ten
    intervals): an idle worker costs PostgreSQL that one statement, not a pass. A split's
    ``nudge`` passes at once, slot or not. After a pass, stragglers are asked to give work
    away where slots are still free (``ask``): after every pass that found nothing, and
    after at most one pass every ten intervals in the whole cluster while children wait
    (one more statement a pass), so a busy cluster costs no more asks than an idle one and
    a queue with free slots beside a backlog elsewhere still gets its straggler cut."""
    slow = 10 * settings.dispatch_interval

    def once() -> int | None:
        leases = services.store().leases
        if not leases.due(PASS_SLOT, settings.dispatch_interval):
            return None  # the cluster's pass this slot is another worker's
        found = _here.once()
        if found == 0:
            ask(settings)  # nothing waits: free slots take work from stragglers
            leases.next_due_in(PASS_SLOT, slow)
        elif found and leases.due(STEAL_SLOT, slow):
            ask(settings)  # children wait, but maybe not for every queue's free slots
        return found

    return Loop("dispatcher", settings.dispatch_interval, once, slow=slow)
