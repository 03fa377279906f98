"""When a run may start: not before its countdown or eta (``apply_async``), and how late
(delay tolerance). Its deadline is its submit time (or schedule
slot) plus the tolerance; a run none of whose children started by then is *late*, and with
``on_late="fail"`` it is failed instead of running late."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from enum import StrEnum

from dtask.exceptions import InvalidDelayTolerance, InvalidStart


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


MAX_COUNTDOWN = 10 * 365 * 24 * 3600.0  # ten years: beyond that a countdown is a typo
QUEUE_NAME = 200  # characters (dtask_runs.queue)


def check_start(countdown: object, eta: object, where: str) -> tuple[datetime | None, float | None]:
    """``apply_async``'s countdown (seconds) or eta (a datetime; naive means UTC), checked:
    (start_at, start_in), at most one of them set."""
    if countdown is not None and eta is not None:
        raise InvalidStart(f"{where}: give countdown or eta, not both")
    if eta is not None:
        if not isinstance(eta, datetime):
            raise InvalidStart(f"{where}: eta must be a datetime, got {eta!r}")
        return (eta if eta.tzinfo is not None else eta.replace(tzinfo=UTC)), None
    if countdown is None:
        return None, None
    if isinstance(countdown, bool) or not isinstance(countdown, int | float):
        raise InvalidStart(f"{where}: countdown must be a number of seconds, got {countdown!r}")
    if not math.isfinite(countdown) or not 0 <= countdown <= MAX_COUNTDOWN:
        raise InvalidStart(
            f"{where}: countdown must be 0 to {MAX_COUNTDOWN:.0f} seconds, got {countdown!r}"
        )
    return None, float(countdown)


def check_queue(queue: object, where: str) -> str | None:
    if queue is None:
        return None
    if not isinstance(queue, str) or not queue.strip() or len(queue) > QUEUE_NAME:
        raise InvalidStart(
            f"{where}: queue must be a name of 1 to {QUEUE_NAME} characters, got {queue!r}"
        )
    return queue
