"""Delay tolerance: how late a run may start. Its deadline is its submit time (or schedule
slot) plus the tolerance; a run none of whose children started by then is *late*, and with
``on_late="fail"`` it is failed instead of running late."""

from __future__ import annotations

import math
from datetime import datetime
from enum import StrEnum

from dtask.exceptions import InvalidDelayTolerance


class OnLate(StrEnum):
    RUN = "run"  # mark it late, run it anyway
    FAIL = "fail"  # fail it: late work is worthless


def check_delay_tolerance(value: object, where: str) -> float | None:
    """Seconds a run may wait before it starts (None: no deadline), checked."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDelayTolerance(
            f"{where}: delay tolerance {value!r} is not a number of seconds"
        )
    if not math.isfinite(value) or value <= 0:
        raise InvalidDelayTolerance(f"{where}: delay tolerance must be > 0 seconds, got {value!r}")
    return float(value)


def on_late_of(value: object, where: str) -> OnLate:
    try:
        return OnLate(value if isinstance(value, str) else repr(value))
    except ValueError:
        raise InvalidDelayTolerance(
            f"{where}: on_late must be one of {', '.join(o.value for o in OnLate)}, got {value!r}"
        ) from None


def late_error(tolerance: float, deadline: datetime) -> str:
    """The error of a run failed for being late (``on_late="fail"``)."""
    return (
        f"not started within its delay tolerance of {tolerance:g} s"
        f" (deadline {deadline.isoformat(timespec='seconds')}): failed instead of running late"
    )
