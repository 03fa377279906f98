"""Where dtask's services are: configured URLs, or the embedded ones started on first use.

Also loads templates (the sample ones and DTASK_TEMPLATES) so every dtask process knows them.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass

from dtask import settings as settings_module
from dtask.db import Database, Limits, Store, engine_for, schema
from dtask.exceptions import ConfigurationError
from dtask.services import embedded
from dtask.settings import Settings


@dataclass(frozen=True)
class Services:
    settings: Settings
    database_url: str
    broker_url: str
    result_backend: str


_lock = threading.Lock()
_current: Services | None = None
_migrated: set[str] = set()
_loaded_templates = False


def broker_urls(config: Settings) -> tuple[str, str]:
    """Broker and result backend URLs; the embedded Redis's are known without starting it."""
    local = embedded.redis_url(config.home)
    return config.broker_url or local, config.result_backend or local


def current() -> Services:
    """Resolve (and for embedded services, start) everything once per process."""
    global _current
    resolved = _current
    if resolved is not None:  # no lock once resolved: a fork while it is held would inherit it
        return resolved
    with _lock:
        if _current is None:
            config = settings_module.load()
            database = config.database_url or embedded.postgres_url(config.home)
            if config.embedded_broker or config.embedded_result_backend:
                embedded.ensure_redis(config.home)
            broker, backend = broker_urls(config)
            _current = Services(config, database, broker, backend)
        return _current


def database_url() -> str:
    return current().database_url


def store() -> Store:
    resolved = current()
    url = resolved.database_url
    limits = Limits.of(resolved.settings)
    engine = engine_for(url, limits=limits)
    if url not in _migrated:
        schema.ensure(engine)
        _migrated.add(url)
    return Store(
        Database(
            engine,
            owner_engine=engine_for(url, owner=True, limits=limits),
            owner_async_engine=engine_for(url, durable=False, owner=True, limits=limits),
        )
    )


def load_templates(config: Settings | None = None) -> None:
    """Import the sample templates and every module named in DTASK_TEMPLATES (once)."""
    global _loaded_templates
    if _loaded_templates:
        return
    importlib.import_module("dtask.examples")
    for module in (config or settings_module.load()).templates:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(
                f"DTASK_TEMPLATES names {module!r}, which cannot be imported: {exc}"
            ) from None
    _loaded_templates = True


def reset() -> None:
    """Forget resolved services (tests that switch DTASK_* variables)."""
    global _current, _loaded_templates
    with _lock:
        _current = None
        _migrated.clear()
        _loaded_templates = False
