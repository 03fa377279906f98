"""Results: a child function may return a small JSON value; a template's ``reduce`` turns its
children's values (in index order) into the run's result, the job a chord's callback does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dtask.domain.limits import json_problem
from dtask.exceptions import InvalidResult

Reduce = Callable[[list[Any]], Any]


def encode_result(value: Any, limit: int, what: str, setting: str) -> str | None:
    """``value`` as JSON text (None stays None), or InvalidResult saying why it cannot be kept."""
    if value is None:
        return None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidResult(f"{what} returned {type(value).__name__}, not JSON: {exc}") from None
    problem = json_problem(value)
    if problem is not None:
        raise InvalidResult(f"{what} returned {problem}, which PostgreSQL cannot store")
    size = len(text.encode())
    if size > limit:
        raise InvalidResult(
            f"{what} returned {size:,} bytes of JSON, over the limit of {limit:,} ({setting})"
        )
    return text


def reduced(reduce: Reduce, results: list[Any], template: str, limit: int) -> str | None:
    """The run's result: ``reduce`` of its children's results, as JSON text. Anything ``reduce``
    raises fails the run with its type and message."""
    what = f"reduce of template {template!r}"
    try:
        value = reduce(results)
    except Exception as exc:
        raise InvalidResult(f"{what} raised {type(exc).__name__}: {exc}") from None
    return encode_result(value, limit, what, "DTASK_MAX_RUN_RESULT")
