"""The backlog caps: DTASK_MAX_BACKLOG unfinished runs per queue (all its tiers), shared fairly
among the clients with runs in it, and DTASK_MAX_CLIENT_BACKLOG per client (the rule:
``dtask.domain.backlog``). A submit past one is refused at once with ``busy`` (Busy: exit 4,
HTTP 503 with Retry-After), nothing created; a bulk submit's runs past it get the outcome
``busy``.

The counts come from PostgreSQL at most once a second per queue and client in each process
(its own submits are added at once): a cap is exact for one submitter, and a burst from many
processes may pass it by about a second of their submits. Overload protection needs no more,
and a count per submit would cost more than the submit."""

from __future__ import annotations

import threading
import time
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


@dataclass
class _Count:
    at: float
    seen: Backlog


_counts: dict[tuple[str, str], _Count] = {}
_lock = threading.Lock()


def admit(run: NewRun, settings: Settings, wanted: int = 1) -> tuple[int, Busy | None]:
    """How many of ``wanted`` more runs like ``run`` (its queue and client, as asked) fit
    under the caps now, and the one line the rest get (None when all fit)."""
    if (settings.max_backlog, settings.max_client_backlog) == (None, None):
        return wanted, None
    seen = _count(_queue(run), run.client).seen
    fits, cap = room(seen, settings.max_backlog, settings.max_client_backlog, wanted)
    return fits, None if cap is None else _refusal(run, settings, seen.added(fits), cap)


def check(run: NewRun, settings: Settings) -> None:
    """Busy unless one more run like ``run`` fits under the caps."""
    _, busy = admit(run, settings)
    if busy is not None:
        raise busy


def added(run: NewRun, created: int) -> None:
    """This process created ``created`` runs like ``run``: counted at once."""
    if created:
        with _lock:
            count = _counts.get((_queue(run), run.client))
            if count is not None:
                count.seen = count.seen.added(created)


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


def _count(queue: str, client: str) -> _Count:
    now = time.monotonic()
    with _lock:
        found = _counts.get((queue, client))
    if found is not None and now - found.at < FRESH:
        return found
    names = [queue, *(f"{queue}.{t.value}" for t in Tier if t is not Tier.BASIC)]
    if queue == DEFAULT_QUEUE:
        names.append("")  # the default queue's basic tier: no queue stored
    found = _Count(now, services.store().runs.backlog(names, client))
    with _lock:
        if len(_counts) > 10_000:
            _counts.clear()
        _counts[(queue, client)] = found
    return found
