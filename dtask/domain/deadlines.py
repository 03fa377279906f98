"""When a run may start: not before its countdown or eta (``apply_async``), and how late
(delay tolerance). Its deadline is its submit time (or schedule
slot) plus the tolerance; a run none of whose children started by then is *late*, and with
``on_late="fail"`` it is failed instead of running late."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from dtask.domain.limits import MAX_SECONDS, check_moment, check_seconds
from dtask.exceptions import InvalidDelayTolerance, InvalidStart


class OnLate(StrEnum):
    RUN = "run"  # mark it late, run it anyway
    FAIL = "fail"  # fail it: late work is worthless


def check_delay_tolerance(value: object, where: str) -> float | None:
    """Seconds a run may wait before it starts (None: no deadline), checked: over 0, at most
    MAX_SECONDS, so that its deadline is a moment every reader can read."""
    if value is None:
        return None
    return check_seconds(f"{where}: delay tolerance", value, InvalidDelayTolerance)


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


MAX_COUNTDOWN = MAX_SECONDS
QUEUE_NAME = 200  # characters (dtask_runs.queue)


def check_start(countdown: object, eta: object, where: str) -> tuple[datetime | None, float | None]:
    """``apply_async``'s countdown (seconds) or eta (a datetime; naive means UTC), checked:
    (start_at, start_in), at most one of them set."""
    if countdown is not None and eta is not None:
        raise InvalidStart(f"{where}: give countdown or eta, not both")
    if eta is not None:
        return check_moment(f"{where}: eta", eta, InvalidStart), None
    if countdown is None:
        return None, None
    return None, check_seconds(f"{where}: countdown", countdown, InvalidStart, zero=True)


def check_queue(queue: object, where: str) -> str | None:
    if queue is None:
        return None
    if not isinstance(queue, str) or not queue.strip() or len(queue) > QUEUE_NAME:
        raise InvalidStart(
            f"{where}: queue must be a name of 1 to {QUEUE_NAME} characters, got {queue!r}"
        )
    return queue
