"""Why a run waits: the one fact that keeps it (or its next children) from running now, in
words, with its numbers. Pure: dtask/db/waiting.py reads the facts the dispatcher reads (live
workers, their queues and templates, the client's cap, the queue's other runs) and
:func:`explain` picks the binding one, in the order a run meets them: its upstreams, its
start time, a worker for its queue and template, then its client's cap, higher priorities
and the queue's slots."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import PurePath

from dtask.domain.dispatch import runnable
from dtask.domain.runs import RunState


class Reason(StrEnum):
    UPSTREAM = "upstream"  # waits for runs it was submitted after
    CONCURRENCY_KEY = "concurrency_key"  # its key's limit of unfinished runs is reached
    START_AFTER = "start_after"  # a countdown or eta not reached
    NO_WORKER = "no_worker"  # no live worker at all
    NO_QUEUE_WORKER = "no_queue_worker"  # none consumes the run's queue
    UNKNOWN_TEMPLATE = "unknown_template"  # the queue's workers do not know its template
    STALE_CODE = "stale_code"  # ... and their code changed on disk since they started
    CLIENT_MAX_RUNNING = "client_max_running"  # its client is at its cap
    PRIORITY = "priority"  # children of higher priority go first in its queue
    SLOTS_BUSY = "slots_busy"  # every slot of its queue is taken
    QUEUED = "queued"  # its children are in the broker, a worker takes them next
    DISPATCH = "dispatch"  # the dispatcher sends its next children at its next pass
    SPLIT_QUEUED = "split_queued"  # its master (the split) waits for a worker


@dataclass(frozen=True)
class Waiting:
    reason: Reason
    text: str


def waiting_json(waiting: Waiting | None) -> dict[str, str | None]:
    """A run's JSON's two fields: ``waiting_because`` (words) and ``waiting_reason`` (a
    :class:`Reason`), both null while nothing holds it."""
    if waiting is None:
        return {"waiting_because": None, "waiting_reason": None}
    return {"waiting_because": waiting.text, "waiting_reason": waiting.reason.value}


@dataclass(frozen=True)
class Upstream:
    id: int
    state: RunState
    finished: int  # children
    total: int


@dataclass(frozen=True)
class Worker:
    """A live worker as the dispatcher sees it; ``changed``: the files of its templates'
    modules that changed on disk since it loaded them (as far as the reader can see them)."""

    name: str
    queues: tuple[str, ...]
    slots: int
    busy: int
    templates: tuple[str, ...] | None  # None: it did not say (it knows any)
    changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class Facts:
    run_id: int
    state: RunState
    template: str
    queue: str  # its queue's name (the default's where it names none)
    client: str
    priority: int
    now: datetime
    start_after: datetime | None = None
    upstreams: Sequence[Upstream] = ()  # the unfinished ones it waits for
    unsent: int = 0  # children waiting in PostgreSQL for the dispatcher
    queued: int = 0  # children sent to the broker, not yet taken
    running: int = 0  # its children running now
    workers: Sequence[Worker] = ()
    max_running: int | None = None  # its client's cap
    client_out: int = 0  # its client's children running or queued, all runs
    higher: int = 0  # children of higher priority in its queue, not yet taken
    others: int = 0  # other runs with children not yet taken in its queue
    queue_running: int = 0  # children running in its queue
    key: KeyFacts | None = None  # its concurrency key, where it has one


@dataclass(frozen=True)
class KeyFacts:
    """A run's concurrency key: its limit, the key's unfinished runs (the first SHOWN of them
    named), and how many of its waiting runs are ahead of this one."""

    name: str
    most: int
    unfinished: int
    holders: Sequence[int]
    ahead: int


WAITS = frozenset((RunState.WAITING, RunState.PENDING, RunState.RUNNING))
SHOWN = 5  # names listed at most (queues, templates, upstreams)


def explain(f: Facts) -> Waiting | None:
    """Why the run, or its next children, do not run now; None when nothing holds it (it is
    finished, being split, or all its children left are running)."""
    if f.state not in WAITS:
        return None
    if f.state is RunState.WAITING:
        if f.upstreams or f.key is None:
            return _upstreams(f.upstreams)
        return _key(f.key, f.client)
    if f.start_after is not None and f.start_after > f.now:
        seconds = (f.start_after - f.now).total_seconds()
        return Waiting(
            Reason.START_AFTER,
            f"starts at {f.start_after:%Y-%m-%d %H:%M:%S %Z} (in {duration(seconds)}), as asked",
        )
    if f.state is RunState.RUNNING and not (f.unsent or f.queued):
        return None  # every child left is running
    worker = _worker(f)
    if worker is not None:
        return worker
    slots = sum(w.slots for w in f.workers if f.queue in w.queues)
    busy = min(slots, max(f.queue_running, sum(w.busy for w in f.workers if f.queue in w.queues)))
    if f.state is RunState.PENDING:
        if busy >= slots and f.higher:
            return Waiting(
                Reason.PRIORITY,
                f"behind {_children(f.higher)} of higher priority in queue {f.queue}"
                " (its split waits for a free slot)",
            )
        if busy >= slots:
            return Waiting(
                Reason.SPLIT_QUEUED,
                f"its split waits for a free slot: all {slots:,} slots of queue {f.queue} are busy",
            )
        return Waiting(
            Reason.SPLIT_QUEUED, f"its split is queued in {f.queue}; a worker takes it next"
        )
    if f.unsent and f.max_running is not None and f.client_out >= f.max_running:
        return Waiting(
            Reason.CLIENT_MAX_RUNNING,
            f"client {f.client} is at --max-running {f.max_running:,}"
            f" ({_children(f.client_out)} running or queued)",
        )
    if f.higher:
        return Waiting(
            Reason.PRIORITY,
            f"behind {_children(f.higher)} of higher priority in queue {f.queue}",
        )
    if busy >= slots:
        others = "1 other run" if f.others == 1 else f"{f.others:,} other runs"
        sharing = f", shared fairly with {others}" if f.others else ""
        return Waiting(
            Reason.SLOTS_BUSY,
            f"all {slots:,} slots of queue {f.queue} are busy{sharing};"
            f" {_of_its(f.unsent + f.queued)}",
        )
    if f.queued:
        return Waiting(
            Reason.QUEUED,
            f"{_children(f.queued)} queued in {f.queue}; workers take them next",
        )
    return Waiting(Reason.DISPATCH, f"{_children(f.unsent)} go out at the dispatcher's next pass")


def _upstreams(upstreams: Sequence[Upstream]) -> Waiting:
    shown = [_upstream(u) for u in upstreams[:SHOWN]]
    more = len(upstreams) - len(shown)
    listed = ", ".join(shown) + (f" and {more:,} more" if more > 0 else "")
    return Waiting(Reason.UPSTREAM, f"waits for run{'s' if len(upstreams) > 1 else ''} {listed}")


def _key(key: KeyFacts, client: str) -> Waiting:
    runs = ", ".join(str(i) for i in key.holders)
    more = key.unfinished - len(key.holders)
    held = f" (run{'s' if key.unfinished > 1 else ''} {runs}" + (
        f" and {more:,} more)" if more > 0 else ")"
    )
    ahead = f"; {key.ahead:,} of its runs wait ahead of this one" if key.ahead else ""
    return Waiting(
        Reason.CONCURRENCY_KEY,
        f"concurrency key {key.name!r} of client {client} is at max_concurrent {key.most:,}:"
        f" {key.unfinished:,} unfinished{held if key.holders else ''}{ahead}; it starts when"
        " one finishes",
    )


def _upstream(u: Upstream) -> str:
    if u.state is RunState.RUNNING and u.total:
        return f"{u.id} ({u.state.value}, {100 * u.finished // u.total} %)"
    return f"{u.id} ({u.state.value})"


def _worker(f: Facts) -> Waiting | None:
    if not f.workers:
        return Waiting(Reason.NO_WORKER, "no live worker: start one (`dtask worker` or `dtask up`)")
    mine = [w for w in f.workers if f.queue in w.queues]
    if not mine:
        consumed = sorted({q for w in f.workers for q in w.queues})
        return Waiting(
            Reason.NO_QUEUE_WORKER,
            f"no live worker consumes queue {f.queue} (workers consume: {_names(consumed)})",
        )
    if runnable(f.template, [w.templates for w in mine]):
        return None
    known = sorted({t for w in mine for t in w.templates or ()})
    close = difflib.get_close_matches(f.template, known, n=SHOWN, cutoff=0.5)
    known = close + [t for t in known if t not in close]  # a typo's likely meaning first
    unknown = f"no live worker knows template {f.template!r} (workers have: {_names(known)})"
    changed = sorted({PurePath(p).name for w in mine for p in w.changed})
    if changed:
        stale = sorted(w.name for w in mine if w.changed)
        return Waiting(
            Reason.STALE_CODE,
            f"{unknown}: workers run an older version of {_names(changed)} (changed since"
            f" {_names(stale)} started; restart them, or run `dtask up --reload`)",
        )
    return Waiting(Reason.UNKNOWN_TEMPLATE, unknown)


def _children(n: int) -> str:
    return f"{n:,} child" if n == 1 else f"{n:,} children"


def _of_its(n: int) -> str:
    return "1 of its children waits" if n == 1 else f"{n:,} of its children wait"


def _names(names: Sequence[str]) -> str:
    if not names:
        return "none"
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more:,} more" if more > 0 else "")


def duration(seconds: float) -> str:
    """A wait in words a person reads at a glance: 12 s, 4 min 10 s, 3 h 5 min, 2 d 4 h."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 // 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h" if s % 86400 // 3600 else f"{s // 86400} d"
