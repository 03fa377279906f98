"""Where dtask's services are: configured URLs, or the embedded ones started on first use."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dtask import settings as settings_module
from dtask import templating
from dtask.db import Database, Limits, Store, engine_for, schema
from dtask.db import engine as engines
from dtask.exceptions import ConfigurationError, StackDown
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
_attach_only = False
_broker_ready: Services | None = None
_migrated: set[str] = set()


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
            database = config.database_url or _embedded_postgres(config.home)
            broker, backend = broker_urls(config)
            _current = Services(config, database, broker, backend)
        return _current


@contextmanager
def attach_only() -> Iterator[None]:
    """Within the block this process only reads: it uses the embedded services where they
    run and never starts them (``dtask runs`` after ``dtask up`` stopped says so, and leaves
    nothing running)."""
    global _attach_only
    before, _attach_only = _attach_only, True
    try:
        yield
    finally:
        _attach_only = before


def _stack_down(home: Path, what: str) -> StackDown:
    return StackDown(
        f"the local stack in {home} is not running (its {what} is stopped): start it with"
        " `dtask up`, or set DTASK_DATABASE_URL and DTASK_BROKER_URL to running services"
    )


def _embedded_postgres(home: Path) -> str:
    if _attach_only and not embedded.postgres_alive(home):
        raise _stack_down(home, "PostgreSQL")
    return embedded.postgres_url(home)


def refuse_mixed() -> None:
    """A configuration that mixes shared and embedded services, refused before anything
    embedded is started for it."""
    resolved = _current
    mixed = (resolved.settings if resolved else settings_module.load()).mixed_services()
    if mixed is not None:
        raise ConfigurationError(mixed)


def ensure_broker() -> Services:
    """The services, once the broker and result backend can be used: a configuration that mixes
    shared and embedded services is refused first, and the embedded Redis started if it is one."""
    global _broker_ready
    resolved = _current
    if resolved is not None and resolved is _broker_ready:
        return resolved
    refuse_mixed()
    resolved = current()
    if resolved.settings.embedded_broker or resolved.settings.embedded_result_backend:
        home = resolved.settings.home
        if _attach_only and not embedded.redis_alive(home):
            raise _stack_down(home, "Redis")
        embedded.ensure_redis(home)
    _broker_ready = resolved
    return resolved


def database_url() -> str:
    return current().database_url


_instead: Callable[[Services], Store | None] | None = None


def use_store(source: Callable[[Services], Store | None] | None) -> None:
    """Where ``source`` gives a store, ``store()`` returns it instead of the resolved
    database's (test mode's: dtask/worker/eager.py)."""
    global _instead
    _instead = source


def store() -> Store:
    """This process's store for the resolved database (made once per process and pool size:
    every child asks for it twice, and making it cost 0.15 ms)."""
    resolved = current()
    if _instead is not None:
        instead = _instead(resolved)
        if instead is not None:
            return instead
    global _last
    pid, size = os.getpid(), engines._own_size
    last = _last
    if last is not None and last[0] is resolved and last[1] == (pid, size):
        return last[2]  # the same as below, without making its key (5 us of every child's)
    url = resolved.database_url
    limits = Limits.of(resolved.settings)
    key = (pid, url, limits)
    made = _stores.get(key)
    if made is not None and made[0] is resolved:
        _last = (resolved, (pid, size), made[1])
        return made[1]
    engine = engine_for(url, limits=limits)
    if url not in _migrated:
        schema.ensure(
            engine, migrate=resolved.settings.embedded_database or resolved.settings.auto_migrate
        )
        _migrated.add(url)
    fresh = Store(Database(engine, limits))
    _stores[key] = (resolved, fresh)
    _last = (resolved, (pid, size), fresh)
    return fresh


_stores: dict[tuple[int, str, Limits], tuple[Services, Store]] = {}
# the store last returned, for what it was made: the settings resolved, the process and its
# role's pool size
_last: tuple[Services, tuple[int, int | None], Store] | None = None


def import_database_driver() -> None:
    """Create this process's engine without connecting: SQLAlchemy imports its PostgreSQL
    dialect (and psycopg) on the first ``create_engine``. A worker's main process must do this
    in its main thread before it forks pool processes: a pool process forked while the reaper
    thread was inside that first import inherits the module's import lock held by a thread it
    does not have, and its first task waits on it for ever (seen with autoscale growing the
    pool and with a replaced pool process, right after the worker started)."""
    engine_for(database_url())


def reset() -> None:
    """Forget resolved services (tests that switch DTASK_* variables)."""
    global _current, _last
    with _lock:
        _current = None
        _migrated.clear()
        _stores.clear()
        _last = None
    templating.reset()
