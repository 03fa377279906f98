"""Where settings come from besides the environment: a host Celery app's ``dtask_*``
configuration, installed by ``dtask.init_app``. Kept apart from ``dtask.settings`` (pydantic)
so that adopting an app in a web process loads nothing until dtask is first used."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple


class Source(NamedTuple):
    """``read`` is called on each ``dtask.settings.load``; the ``fixed`` settings (the host's
    broker and result backend: messages go through them) no variable may change."""

    read: Callable[[], Mapping[str, Any]]
    fixed: frozenset[str]


_source: Source | None = None


def use_source(read: Callable[[], Mapping[str, Any]] | None, fixed: tuple[str, ...] = ()) -> None:
    global _source
    _source = None if read is None else Source(read, frozenset(fixed))


def current() -> Source | None:
    return _source
