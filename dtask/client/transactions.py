"""Submits tied to the caller's database transaction.

``Template.delay_on_commit`` submits once the caller's Django transaction commits, as Celery's
``delay_on_commit`` sends (at once outside a transaction, or where Django is not set up), and
nothing if it rolls back. ``dtask.submit(..., using=ALIAS)`` (a Django database alias) or
``connection=`` (a psycopg 3 connection, a SQLAlchemy ``Connection``, or a Django connection)
writes the run in the caller's own transaction, where dtask's tables are in the caller's
database: a rollback leaves no run and sends nothing; after the commit its master is sent
(through Django's ``on_commit``; for a connection of another kind, the reaper sends the master
of a committed run whose master was never sent, within DTASK_STALL_TIMEOUT).

Django is imported only here, and only when the caller asks for it or has set it up.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from dtask import services
from dtask.db.callers import check_shared, database_name, lend
from dtask.exceptions import ConfigurationError


def django_transaction() -> ModuleType | None:
    """``django.db.transaction`` where the process has set Django up, else None."""
    if "django" not in sys.modules:
        return None
    from django.conf import settings  # type: ignore[import-untyped]

    if not settings.configured:
        return None
    from django.db import transaction  # type: ignore[import-untyped]

    module: ModuleType = transaction
    return module


def on_commit(callback: Callable[[], Any], using: str | None = None) -> None:
    """``callback()`` once the caller's Django transaction on ``using`` (default: Django's
    default database) commits, never if it rolls back; at once outside a transaction, or
    where Django is not set up (as Celery's ``delay_on_commit`` sends at once then)."""
    transaction = django_transaction()
    if transaction is None:
        callback()
        return
    transaction.on_commit(callback, using=using)


@dataclass(frozen=True)
class Written:
    """Where a submit on the caller's connection writes (``conn``), and how the master is sent
    after the caller's commit (``after_commit(send)``: False where no commit can be waited
    for: the reaper then sends the master of the committed run)."""

    conn: Any
    alias: str | None

    def after_commit(self, send: Callable[[], None]) -> bool:
        if self.alias is None:
            return False
        transaction = django_transaction()
        assert transaction is not None
        transaction.on_commit(send, using=self.alias)
        return True


@contextmanager
def written_on(using: str | None, connection: Any) -> Iterator[Written]:
    """The caller's connection for a submit's statements: Django's ``using`` alias (or a
    Django connection given as ``connection``), inside a savepoint of the caller's transaction
    (``transaction.atomic``: a transaction of its own outside one); else a psycopg 3 or
    SQLAlchemy connection, inside a savepoint of its transaction. Its database must be dtask's,
    with dtask's tables."""
    if using is not None and connection is not None:
        raise ConfigurationError("submit takes using= (a Django database alias) or connection=")
    if connection is not None and is_django_connection(connection):
        using, connection = connection.alias, None
    expected = database_name(services.database_url())
    if using is None:
        with lend(connection) as conn:
            check_shared(conn, expected)
            yield Written(conn, None)
        return
    transaction = django_transaction()
    if transaction is None:
        raise ConfigurationError(
            f"submit(using={using!r}) names a Django database, but Django is not set up in this"
            " process (django.setup())"
        )
    from django.db import connections

    if using not in connections:
        raise ConfigurationError(f"submit(using={using!r}): Django has no database {using!r}")
    wrapper = connections[using]
    with transaction.atomic(using=using):
        wrapper.ensure_connection()
        with lend(wrapper.connection, savepoint=False) as conn:
            check_shared(conn, expected)
            yield Written(conn, using)


def is_django_connection(connection: Any) -> bool:
    module = type(connection).__module__
    return module.startswith("django.") and hasattr(connection, "alias")
