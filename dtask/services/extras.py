"""Optional parts of dtask, installed by extras: ``dtask[local]`` (the embedded PostgreSQL and
Redis), ``dtask[api]`` (`dtask serve`: the HTTP API, the dashboard, /metrics) and
``dtask[flower]``. A production worker needs none of them."""

from __future__ import annotations

import importlib
from types import ModuleType

from dtask.exceptions import MissingExtra


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module``, or say in one line which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"{what} needs the {module} package: pip install 'dtask[{extra}]'"
            + (" (or set DTASK_DATABASE_URL and DTASK_BROKER_URL)" if extra == "local" else "")
        ) from None
