"""Clients of the shared service: who submits, at what rate, with which limits.

Pure: parsing and checking a client's settings, and the rate-limit arithmetic. The limits are
enforced where the truth is: rates in the submit's transaction (dtask/db/clients.py), the
others by the dispatcher.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from dtask.domain.limits import shown
from dtask.exceptions import InvalidClient, RateLimited

DEFAULT_CLIENT = "default"
LOWEST_PRIORITY, HIGHEST_PRIORITY, DEFAULT_PRIORITY = 0, 9, 5
PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SETTINGS = frozenset(("rate", "child_rate", "max_running", "weight", "tier", "max_priority"))
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,99}")
_RATE = re.compile(r"\s*([0-9]+)\s*/\s*([smhd])\s*")


class Tier(StrEnum):
    """Resource tiers, lowest first: work of a tier runs on workers of that tier or higher."""

    BASIC = "basic"
    REGULAR = "regular"
    PREMIUM = "premium"

    @property
    def rank(self) -> int:
        return list(Tier).index(self)


def check_name(name: str) -> str:
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidClient(
            f"client name {shown(name)} must be 1 to 100 letters, digits or '_.@:-',"
            " starting with a letter or digit"
        )
    return name


def check_priority(priority: int, what: str = "priority") -> int:
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not LOWEST_PRIORITY <= priority <= HIGHEST_PRIORITY
    ):
        raise InvalidClient(
            f"{what} must be a whole number from {LOWEST_PRIORITY} (lowest) to"
            f" {HIGHEST_PRIORITY} (highest), got {shown(priority)}"
        )
    return priority


MAX_COUNT = 2**31 - 1  # rates and max_running are PostgreSQL integers


@dataclass(frozen=True)
class Rate:
    """At most ``count`` per ``period`` (s, m, h or d), over a sliding window."""

    count: int
    period: str

    @classmethod
    def parse(cls, text: str, what: str = "rate") -> Rate:
        match = _RATE.fullmatch(text) if isinstance(text, str) else None
        # int() refuses over 4,300 digits: the length decides first
        if match is None or len(match.group(1)) > 10 or not 1 <= int(match.group(1)) <= MAX_COUNT:
            raise InvalidClient(
                f"{what} must look like N/PERIOD with N from 1 to {MAX_COUNT:,} and PERIOD one"
                f" of s, m, h, d (for example 50/m), got {shown(text, 40)}"
            )
        return cls(int(match.group(1)), match.group(2))

    @property
    def seconds(self) -> int:
        return PERIODS[self.period]

    def __str__(self) -> str:
        return f"{self.count}/{self.period}"


def retry_after(
    window: Iterable[tuple[datetime, int]], limit: Rate, cost: int, now: datetime
) -> float | None:
    """Seconds until ``cost`` more fits under ``limit``, given what the sliding window holds
    (``(accepted at, cost)``, oldest first, all within the last period); None: it fits now.

    The wait ends when enough of the oldest entries have left the window: an entry accepted at
    ``t`` leaves it at ``t + period``."""
    entries = list(window)
    used = sum(c for _, c in entries)
    if used + cost <= limit.count:
        return None
    for at, c in entries:
        used -= c
        if used + cost <= limit.count:
            return max(0.0, (at - now).total_seconds() + limit.seconds)
    return math.inf  # more than the limit itself: it never fits


def refusal(limit: Rate, what: str, cost: int, wait: float, client: str) -> RateLimited:
    """The one-line error a refused submit gets."""
    if math.isinf(wait):
        return RateLimited(
            f"limit exceeded: a run of {cost} {what} is more than client {client!r}'s limit of"
            f" {limit} {what}; it can never be accepted (raise the limit with"
            f" `dtask client set {client} --{'child-rate' if what == 'children' else 'rate'}`)",
            retry_after=math.inf,
        )
    seconds = max(1, math.ceil(wait))
    return RateLimited(
        f"limit exceeded: client {client!r} may submit {limit} {what}; retry in {seconds} s",
        retry_after=seconds,
    )


@dataclass(frozen=True)
class Client:
    """A client's settings. None means no limit; ``tier`` None means the lowest tier."""

    name: str
    rate: Rate | None = None
    child_rate: Rate | None = None
    max_running: int | None = None
    weight: float = 1.0
    tier: Tier | None = None
    max_priority: int = HIGHEST_PRIORITY
    usage: dict[str, int] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.max_running is not None and (
            isinstance(self.max_running, bool)
            or not isinstance(self.max_running, int)
            or not 1 <= self.max_running <= MAX_COUNT
        ):
            raise InvalidClient(
                f"max_running must be a whole number from 1 to {MAX_COUNT:,},"
                f" got {shown(self.max_running)}"
            )
        if (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, int | float)
            or not 0 < self.weight <= 1000
        ):
            raise InvalidClient(
                f"weight must be a number above 0 and at most 1000, got {shown(self.weight)}"
            )
        check_priority(self.max_priority, "max_priority")

    def changed(self, **settings: Any) -> Client:
        """This client with ``settings`` changed (each checked); unknown names are refused."""
        unknown = set(settings) - SETTINGS
        if unknown:
            raise InvalidClient(f"unknown client setting(s): {', '.join(sorted(unknown))}")
        for name in ("rate", "child_rate"):
            if isinstance(settings.get(name), str):
                settings[name] = Rate.parse(settings[name], name.replace("_", "-"))
        if isinstance(settings.get("tier"), str):
            settings["tier"] = tier_of(settings["tier"])
        return replace(self, **settings)

    def priority_for(self, requested: int | None) -> int:
        """The priority a run of this client gets: as asked (default 5), capped at its maximum."""
        wanted = DEFAULT_PRIORITY if requested is None else check_priority(requested)
        return min(wanted, self.max_priority)

    def tier_for(self, requested: Tier | None) -> Tier:
        """The tier a run of this client gets: as asked, else the client's; a client with a
        tier set may not ask for a higher one (capped, as priorities are)."""
        if requested is None:
            return self.tier or Tier.BASIC
        if self.tier is None or requested.rank <= self.tier.rank:
            return requested
        return self.tier

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "name": self.name,
            "rate": None if self.rate is None else str(self.rate),
            "child_rate": None if self.child_rate is None else str(self.child_rate),
            "max_running": self.max_running,
            "weight": self.weight,
            "tier": (self.tier or Tier.BASIC).value,
            "max_priority": self.max_priority,
        }
        if self.usage:
            shown["usage"] = dict(self.usage)
        return shown


def tier_of(text: str) -> Tier:
    try:
        return Tier(text)
    except ValueError:
        raise InvalidClient(
            f"tier must be one of {', '.join(t.value for t in Tier)}, got {text!r}"
        ) from None
