"""Concurrency keys: at most ``max_concurrent`` unfinished runs of a client per key at a time
("one export per customer"). A run over the limit waits, and runs of a key start in the order
they were submitted as earlier ones finish. The key is a template of the run's parameters
(``"${customer}"``), rendered at submit; PostgreSQL counts (:mod:`dtask.db.concurrency`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dtask.domain.limits import check_whole
from dtask.domain.placeholders import placeholders, render
from dtask.exceptions import DtaskError, InvalidConcurrency, InvalidVariables

MOST_CONCURRENT = 10_000
KEY_CHARS = 200  # a rendered key's length at most


@dataclass(frozen=True)
class Concurrency:
    """A template's (or a submit's) key, as written (placeholders of its parameters), and how
    many unfinished runs of one client may share a rendered key."""

    key: str
    most: int = 1


def check_concurrency(
    key: object,
    most: object,
    where: str,
    params: set[str],
    error: type[DtaskError] = InvalidConcurrency,
) -> Concurrency | None:
    """The key and limit as given (None and None: none); ``error`` names what is wrong."""
    if key is None:
        if most is not None:
            raise error(f"{where}: max_concurrent limits runs per concurrency_key; name a key")
        return None
    if not isinstance(key, str) or not key.strip() or "\x00" in key:
        raise error(f"{where}: concurrency_key must be text such as '${{customer}}', got {key!r}")
    unknown = placeholders(key) - params
    if unknown:
        raise error(
            f"{where}: concurrency_key {key!r} names {', '.join(sorted(unknown))}, not a"
            f" parameter (parameters: {', '.join(sorted(params)) or 'none'})"
        )
    limit = (
        1
        if most is None
        else check_whole(f"{where}: max_concurrent", most, 1, MOST_CONCURRENT, error)
    )
    return Concurrency(key, limit)


def key_of(concurrency: Concurrency, variables: Mapping[str, Any], where: str) -> str:
    """The key of a run with ``variables`` (checked already); InvalidVariables where it would
    be empty or longer than KEY_CHARS."""
    value = render(concurrency.key, variables)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    if not text.strip() or len(text) > KEY_CHARS or "\x00" in text:
        raise InvalidVariables(
            f"{where}: its concurrency key {concurrency.key!r} renders to {text[:40]!r}"
            f"{'...' if len(text) > 40 else ''}; a key is 1 to {KEY_CHARS} characters"
        )
    return text


def run_limit(
    concurrency: Concurrency | None, variables: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """A run's ``concurrency_key`` and ``max_concurrent`` (NewRun's fields) from its template's
    (or submit's) concurrency and its variables: both None without one."""
    if concurrency is None:
        return {"concurrency_key": None, "max_concurrent": None}
    return {
        "concurrency_key": key_of(concurrency, variables, where),
        "max_concurrent": concurrency.most,
    }
