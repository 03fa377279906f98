"""Bulk submits: what became of each item, and which of a chunk's new runs a client's rates
admit (in input order, each counted as a submit of its own would be)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from dtask.domain.clients import Rate, retry_after

MOST_PER_CHUNK = 1000  # runs written in one transaction (and one INSERT)


class Outcome(StrEnum):
    CREATED = "created"
    KNOWN_KEY = "known_key"  # the client's key had triggered a run already: that run
    INVALID = "invalid"  # its variables (or its key) refused; nothing written
    LIMIT_EXCEEDED = "limit_exceeded"  # the client's rate limit refused it; retry_after
    BUSY = "busy"  # past the queue's or client's backlog cap (DTASK_MAX_BACKLOG); retry_after


@dataclass(frozen=True)
class Submitted:
    """One item of a bulk submit: ``index`` in the input, its outcome, its run (created, or the
    one its key had triggered), or why not (``error``, and ``retry_after`` seconds for a
    rate limit: None where it can never fit)."""

    index: int
    outcome: Outcome
    run_id: int | None = None
    error: str | None = None
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.CREATED, Outcome.KNOWN_KEY)

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"index": self.index, "outcome": self.outcome.value}
        if self.run_id is not None:
            shown["run_id"] = self.run_id
        if self.error is not None:
            shown["error"] = self.error
        if self.outcome in (Outcome.LIMIT_EXCEEDED, Outcome.BUSY):
            shown["retry_after"] = self.retry_after
        return shown


@dataclass(frozen=True)
class Window:
    """One of a client's rates and what its sliding window holds now: ``(accepted at, cost)``,
    oldest first."""

    rate: Rate
    entries: Sequence[tuple[datetime, int]]


@dataclass(frozen=True)
class Refused:
    """Which window refused an item (its index in the windows given), and the seconds until
    the item would fit (``math.inf``: never, it costs more than the rate itself)."""

    window: int
    wait: float


def admit(
    windows: Sequence[Window], costs: Sequence[Sequence[int]], now: datetime
) -> list[Refused | None]:
    """For each new run in input order (``costs[i][w]``: what it costs under window ``w``):
    None when every window admits it after what they hold and the runs admitted before it,
    else the first window that refuses it. Admitted runs count from ``now``; a run refused
    does not count, so a later, cheaper one may still fit."""
    used = [sum(c for _, c in w.entries) for w in windows]
    admitted: list[list[tuple[datetime, int]]] = [[] for _ in windows]
    found: list[Refused | None] = []
    waits: dict[tuple[int, int, int], float] = {}  # (window, cost, admitted so far) -> wait
    for cost in costs:
        full = next(
            (w for w, window in enumerate(windows) if used[w] + cost[w] > window.rate.count),
            None,
        )
        if full is None:
            for w in range(len(windows)):
                used[w] += cost[w]
                admitted[w].append((now, cost[w]))
            found.append(None)
            continue
        key = (full, cost[full], len(admitted[full]))
        if key not in waits:
            window = windows[full]
            entries = [*window.entries, *admitted[full]]
            waits[key] = retry_after(entries, window.rate, cost[full], now) or 0.0
        found.append(Refused(full, waits[key]))
    return found


def shown_wait(wait: float) -> float | None:
    """A wait as JSON shows it: whole seconds, None for never."""
    return None if math.isinf(wait) else float(max(1, math.ceil(wait)))
