"""The backlog caps: DTASK_MAX_BACKLOG unfinished runs per queue (all its tiers), shared fairly
among the clients with runs in it, and DTASK_MAX_CLIENT_BACKLOG per client (the rule:
``dtask.domain.backlog``). A submit past one is refused at once with ``busy`` (Busy: exit 4,
HTTP 503 with Retry-After), nothing created; a bulk submit's runs past it get the outcome
``busy``.

The counts come from PostgreSQL at most once a second per queue and client in each process.
What a submit admits is reserved in them at once, under one lock, before its runs are written
(``admit``), and settled as what it created once written (``added``; a submit that fails
between leaves its reservation until that thread's next submit, or ``STALE``); reservations
outlive a re-read, which cannot see runs not yet committed. So within one process, however
many threads submit at once, none takes room another took: one process alone never passes a
cap or the ceiling; a burst from many processes may pass it by about a second of theirs. Overload
protection needs no more, and a count per submit would cost more than the submit."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from dtask import services
from dtask.domain.backlog import Backlog, Cap, room, share
from dtask.domain.clients import Tier
from dtask.domain.runs import NewRun
from dtask.domain.tiers import DEFAULT_QUEUE, base_queue
from dtask.exceptions import Busy
from dtask.settings import Settings

FRESH = 1.0  # seconds a count is used before it is read again
RETRY_AFTER = 5.0  # seconds a refused caller is told to wait
STALE = 60.0  # seconds a reservation is held when its submit never says what it created
RECENT = 10.0  # seconds this process's creations are added to a read begun before them

_Key = tuple[str, str]  # (queue, client)


@dataclass
class _Count:
    at: float  # when its read from PostgreSQL began
    seen: Backlog  # as read then, plus the runs this process created since


@dataclass(frozen=True)
class _Runs:
    """Runs this process reserved or created: ``n`` in ``queue`` for ``client``."""

    at: float
    queue: str
    client: str
    n: int


_counts: dict[_Key, _Count] = {}
_reserved: dict[int, _Runs] = {}  # admitted, not yet created, by token
_created: deque[_Runs] = deque()  # created in the last RECENT seconds, oldest first
_lock = threading.Lock()
_tokens = itertools.count()
_mine = threading.local()  # .token: this thread's reservation, while its submit writes


def admit(run: NewRun, settings: Settings, wanted: int = 1) -> tuple[int, Busy | None]:
    """How many of ``wanted`` more runs like ``run`` (its queue and client, as asked) fit
    under the caps now, and the one line the rest get (None when all fit).

    The runs that fit are reserved at once in this process's counts (``_lock`` held from
    the look to the reservation), so concurrent submits cannot take the same room; ``added``
    settles them once written."""
    if (settings.max_backlog, settings.max_client_backlog) == (None, None):
        return wanted, None
    key = (_queue(run), run.client)
    with _lock:
        _release()  # this thread's last submit failed before it said what it created
    fresh = _read(key)
    with _lock:
        seen = _with(_counts.setdefault(key, fresh).seen, key, _reserved.values())
        fits, cap = room(seen, settings.max_backlog, settings.max_client_backlog, wanted)
        if fits:
            _mine.token = next(_tokens)
            _reserved[_mine.token] = _Runs(time.monotonic(), *key, fits)
    return fits, None if cap is None else _refusal(run, settings, seen.added(fits), cap)


def check(run: NewRun, settings: Settings) -> None:
    """Busy unless one more run like ``run`` fits under the caps (reserved: ``admit``)."""
    _, busy = admit(run, settings)
    if busy is not None:
        raise busy


def added(run: NewRun, created: int) -> None:
    """This process created ``created`` runs like ``run``: counted at once in every count
    they touch, in place of what this thread's ``admit`` reserved for them."""
    with _lock:
        _release()
        if not created:
            return
        runs = _Runs(time.monotonic(), _queue(run), run.client, created)
        for key, count in _counts.items():
            count.seen = _with(count.seen, key, [runs])
        _created.append(runs)
        while _created and runs.at - _created[0].at > RECENT:
            _created.popleft()


def _release() -> None:
    """This thread's reservation given back (``_lock`` held)."""
    token = getattr(_mine, "token", None)
    if token is not None:
        _reserved.pop(token, None)
        _mine.token = None


def _with(seen: Backlog, key: _Key, more: Iterable[_Runs]) -> Backlog:
    """``seen`` (the count of ``key``) with ``more`` runs, where they count."""
    queue, client = key
    in_queue = mine = anywhere = 0
    others = set()
    for runs in more:
        if runs.queue == queue:
            in_queue += runs.n
            if runs.client == client:
                mine += runs.n
            else:
                others.add(runs.client)
        if runs.client == client:
            anywhere += runs.n
    return Backlog(
        seen.queue + in_queue,
        max(seen.others, len(others)),  # at least the clients seen here; maybe more
        seen.mine + mine,
        seen.client + anywhere,
    )


def _refusal(run: NewRun, settings: Settings, seen: Backlog, cap: Cap) -> Busy:
    """The one line a submit refused by ``cap`` gets (``seen``: once the runs that fit are
    created)."""
    queue, limit = _queue(run), settings.max_backlog or 0
    if cap is Cap.QUEUE:
        clients = seen.others + 1
        what = f"queue {queue!r} holds {_runs(seen.queue)} (DTASK_MAX_BACKLOG {limit:,})"
        what += f" and client {run.client!r} holds {seen.mine:,} of them, at least its share"
        what += f" ({share(limit, seen.others):,}: the cap among {clients:,}"
        what += f" client{'' if clients == 1 else 's'} with runs there)"
    elif cap is Cap.CEILING:
        what = f"queue {queue!r} holds {_runs(seen.queue)}, twice DTASK_MAX_BACKLOG {limit:,}"
        what += " (clients below their share may pass the cap up to that)"
    else:
        what = f"client {run.client!r} has {_runs(seen.client)}"
        what += f" (DTASK_MAX_CLIENT_BACKLOG {settings.max_client_backlog:,})"
    return Busy(
        f"busy: {what}; nothing was created, retry in {RETRY_AFTER:g} s",
        retry_after=RETRY_AFTER,
    )


def _runs(count: int) -> str:
    return f"{count:,} unfinished run{'' if count == 1 else 's'}"


def _queue(run: NewRun) -> str:
    return base_queue(run.queue or DEFAULT_QUEUE)


def _read(key: _Key) -> _Count:
    """The count of ``key``: the cached one while fresh, else read again (outside the lock:
    other submits go on meanwhile), with what this process created since the read began,
    which it may not have seen committed. Reservations stay apart: a read cannot see them."""
    now = time.monotonic()
    with _lock:
        found = _counts.get(key)
    if found is not None and now - found.at < FRESH:
        return found
    queue, client = key
    names = [queue, *(f"{queue}.{t.value}" for t in Tier if t is not Tier.BASIC)]
    if queue == DEFAULT_QUEUE:
        names.append("")  # the default queue's basic tier: no queue stored
    seen = services.store().runs.backlog(names, client)
    with _lock:
        old = _counts.get(key)
        if old is not None and old.at >= now:
            return old  # another thread read it since this one began
        fresh = _Count(now, _with(seen, key, (r for r in _created if r.at >= now)))
        for token in [t for t, r in _reserved.items() if now - r.at > STALE]:
            del _reserved[token]  # a thread that never submits again
        if len(_counts) > 10_000:
            _counts.clear()
        _counts[key] = fresh
    return fresh
