"""The backlog caps: DTASK_MAX_BACKLOG unfinished runs per queue (all its tiers), and
DTASK_MAX_CLIENT_BACKLOG per client. A submit past one is refused at once with ``busy``
(Busy: exit 4, HTTP 503 with Retry-After), nothing created; a bulk submit's runs past it get
the outcome ``busy``.

The counts come from PostgreSQL at most once a second per queue and client in each process
(its own submits are added at once): a cap is exact for one submitter, and a burst from many
processes may pass it by about a second of their submits. Overload protection needs no more,
and a count per submit would cost more than the submit."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from dtask import services
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
    queue: int
    client: int


_counts: dict[tuple[str, str], _Count] = {}
_lock = threading.Lock()


def admit(run: NewRun, settings: Settings, wanted: int = 1) -> tuple[int, Busy | None]:
    """How many of ``wanted`` more runs like ``run`` (its queue and client, as asked) fit
    under the caps now, and the one line the rest get (None when all fit)."""
    caps = (settings.max_backlog, settings.max_client_backlog)
    if caps == (None, None):
        return wanted, None
    count = _count(_queue(run), run.client)
    used = (count.queue, count.client)
    rooms = [cap - n for cap, n in zip(caps, used, strict=True) if cap is not None]
    fits = max(0, min(wanted, *rooms))
    return fits, None if fits == wanted else _refusal(run, settings, count, fits)


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
                count.queue += created
                count.client += created


def _refusal(run: NewRun, settings: Settings, count: _Count, adding: int) -> Busy:
    """The one line a submit past a cap gets (once ``adding`` more runs are created)."""
    queued, owned = count.queue + adding, count.client + adding
    if settings.max_backlog is not None and queued >= settings.max_backlog:
        what = f"queue {_queue(run)!r} holds {_runs(queued)} (DTASK_MAX_BACKLOG"
        what += f" {settings.max_backlog:,})"
    else:
        what = f"client {run.client!r} has {_runs(owned)}"
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
    in_queue, of_client = services.store().runs.backlog(names, client)
    found = _Count(now, in_queue, of_client)
    with _lock:
        if len(_counts) > 10_000:
            _counts.clear()
        _counts[(queue, client)] = found
    return found
