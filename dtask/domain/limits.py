"""Bounds on what a client may hand dtask: sizes of JSON, lengths and contents of text. Every
check raises the caller's DtaskError with one line naming the value, the limit and the setting
that moves it. Pure."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from dtask.exceptions import DtaskError, InvalidStart

# Every duration a caller gives (a delay tolerance, a countdown, an execution cap) is at most
# ten years: beyond that it is a typo, and a deadline or start it makes must stay a moment
# that PostgreSQL, psycopg and Python all read (psycopg and datetime stop at year 9999).
MAX_SECONDS = 10 * 365 * 86400.0
# Every moment a caller gives (an eta, a schedule's start and end) lies in these years, so
# that moment plus MAX_SECONDS is still readable.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
MAX_ATTEMPTS = 1000  # attempts of one child: each is a row write and a log line
KEY_LENGTH = 300  # dtask_runs.trigger_key
POOL_PROCESS_CONNECTIONS = 1  # a prefork pool process's: its child's and heartbeat's, in turn
MAIN_PROCESS_CONNECTIONS = 2  # a prefork worker's main process's: its loops', in turn
RESERVED_KEY_PREFIX = "schedule:"  # schedule:<name>:<slot>: a schedule's slots, not a user's


def json_bytes(value: Any) -> int:
    """The size of ``value`` as compact JSON, in UTF-8 bytes (ValueError: not JSON)."""
    return len(
        json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    )


def check_json_size(
    what: str, value: Any, limit: int, setting: str, error: type[DtaskError]
) -> None:
    try:
        size = json_bytes(value)
    except (TypeError, ValueError, RecursionError) as exc:
        # an integer of over 4,300 digits, NaN, a cycle, nesting deeper than Python recurses
        raise error(f"{what} is not storable JSON: {str(exc)[:120]}") from None
    if size > limit:
        raise error(f"{what} is {size:,} bytes of JSON, over the limit of {limit:,} ({setting})")


def check_seconds(
    what: str,
    value: object,
    error: type[DtaskError],
    *,
    low: float = 0.0,
    high: float = MAX_SECONDS,
    zero: bool = False,
) -> float:
    """A number of seconds from ``low`` (excluded unless ``zero``) to ``high``, checked: the
    one-line error names the value and both bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{what} must be a number of seconds, got {_shown(value)}")
    try:
        number = float(value) if math.isfinite(value) else math.nan
    except OverflowError:  # an integer past any float
        number = math.inf
    within = (low <= number if zero else low < number) and number <= high
    if not within:
        span = f"{low:g} to" if zero else f"over {low:g} and at most"
        raise error(f"{what} must be {span} {high:,.0f} seconds, got {_shown(value)}")
    return number


def check_moment(what: str, value: object, error: type[DtaskError]) -> datetime:
    """A datetime (naive means UTC) between EARLIEST and LATEST, checked."""
    if not isinstance(value, datetime):
        raise error(f"{what} must be a datetime, got {_shown(value)}")
    try:
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        inside = EARLIEST <= moment < LATEST
    except (OverflowError, ValueError):  # an offset that moves it past year 1 or 9999
        inside = False
    if not inside:
        raise error(
            f"{what} must lie between {EARLIEST.year} and {LATEST.year - 1},"
            f" got {value.isoformat()}"
        )
    return moment


def check_whole(what: str, value: object, low: int, high: int, error: type[DtaskError]) -> int:
    """A whole number from ``low`` to ``high``, checked."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise error(f"{what} must be a whole number from {low:,} to {high:,}, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    return shown(value, 60)


def shown(value: object, width: int = 80) -> str:
    """``value`` for a one-line error, at most ``width`` characters: repr() refuses an integer
    past 4,300 digits (inside a list too) and nesting deeper than Python recurses."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        digits = math.floor(math.log10(abs(value))) + 1  # a float's log: 1 too many at 99..9
        return f"an integer of {digits - (abs(value) < 10 ** (digits - 1)):,} digits"
    try:
        text = repr(value[: width + 1] if isinstance(value, str) else value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= width else text[: width - 3] + "..."


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as PostgreSQL text, if it cannot."""
    if "\x00" in text:
        return "holds a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (undecodable bytes)"
    return None


def json_problem(value: Any) -> str | None:
    """Why PostgreSQL's jsonb would refuse ``value`` (already JSON), if it would: a string or
    key holding a NUL or a lone surrogate. Walked without recursion: any depth is read."""
    todo = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, str):
            problem = text_problem(node)
            if problem is not None:
                return f"a string that {problem}"
        elif isinstance(node, dict):
            todo.extend(node.keys())
            todo.extend(node.values())
        elif isinstance(node, list | tuple):
            todo.extend(node)
    return None


def check_text(what: str, text: str, max_length: int, error: type[DtaskError]) -> str:
    problem = text_problem(text)
    if problem is not None:
        raise error(f"{what} {problem}")
    if len(text) > max_length:
        raise error(f"{what} is {len(text):,} characters, over the limit of {max_length:,}")
    return text


def check_key(key: str, where: str) -> str:
    """A user's trigger key: storable, at most KEY_LENGTH characters, not a schedule's."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidStart(f"{where}: the key is empty (leave it out for an ad hoc run)")
    check_text(f"{where}: the key", key, KEY_LENGTH, InvalidStart)
    if key.startswith(RESERVED_KEY_PREFIX):
        raise InvalidStart(
            f"{where}: keys starting with {RESERVED_KEY_PREFIX!r} are reserved for schedule"
            " slots (dtask schedule add); use another key"
        )
    return key


def worker_connections(concurrency: int, per_process: int, forks: bool = True) -> int:
    """The most PostgreSQL connections a worker can hold: with a prefork pool (``forks``),
    MAIN_PROCESS_CONNECTIONS in its main process and POOL_PROCESS_CONNECTIONS in each of its
    ``concurrency`` pool processes; with a threads pool, whose children share the main
    process's pool, ``per_process`` (DTASK_DB_POOL). Each pool stops there (no overflow)."""
    if forks:
        return MAIN_PROCESS_CONNECTIONS + POOL_PROCESS_CONNECTIONS * concurrency
    return per_process


SERVER_REMEDY = (
    "put PgBouncer in transaction mode in front (docs/scaling.md), or raise max_connections"
)


def over_budget(
    mine: int, in_use: int, usable: int, limit: str, how: str, remedy: str = SERVER_REMEDY
) -> str | None:
    """Why a worker that may hold ``mine`` connections cannot start where ``in_use`` of the
    ``usable`` are taken now (by anyone: rows of workers that are gone hold none), or None
    when it fits. ``limit`` names where ``usable`` comes from, ``how`` the worker, ``remedy``
    what else than a smaller worker helps."""
    if mine + in_use <= usable:
        return None
    return (
        f"a worker of {how} may hold {mine} PostgreSQL connections; with the {in_use} in use"
        f" that makes {mine + in_use}, over the {usable} {limit}: lower --concurrency or"
        f" DTASK_DB_POOL, or {remedy}"
    )


def short_at_peak(mine: int, others: list[int], usable: int) -> str | None:
    """Why this worker and the live ones (``others``: what each may hold) could run out of
    connections when all are at their busiest, or None: a warning, not a refusal (a rolling
    deploy starts new workers before the old ones leave)."""
    total = mine + sum(others)
    if total <= usable:
        return None
    return (
        f"this worker and {len(others)} live one(s) may hold {total} PostgreSQL connections at"
        f" their busiest, over the {usable} the server allows: a statement may then wait for"
        " or be refused a connection (docs/scaling.md)"
    )
