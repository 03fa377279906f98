"""Transaction plumbing shared by every store: engines, transactions, advisory locks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from psycopg.errors import IdleInTransactionSessionTimeout
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import InternalError, OperationalError, ProgrammingError

from dtask.db.engine import unreachable
from dtask.exceptions import DatabaseUnavailable, DtaskError
from dtask.settings import mask

RUN_LOCKS = 0x64746B  # "dtk": keeps our advisory locks apart from the application's
REAPER_LOCK = 0x64746C

# Statements are parsed once per process: building a TextClause costs more than a short
# child's whole UPDATE round trip.
sql = lru_cache(maxsize=None)(text)


def lock_run(conn: Connection, run_id: int, wait: bool = True) -> bool:
    """The run's advisory lock for this transaction; with ``wait=False``, only if free."""
    # Transaction-level only: session locks would leak across pooled connections.
    function = "pg_advisory_xact_lock" if wait else "pg_try_advisory_xact_lock"
    result = conn.execute(
        sql(f"SELECT {function}(:ns, :key)"), {"ns": RUN_LOCKS, "key": run_id & 0x7FFFFFFF}
    ).scalar()
    return wait or bool(result)


class Database:
    """``lease_engine`` (an autocommit engine; default: ``engine`` in autocommit) runs a child
    owner's claim, heartbeat and state writes. services.store() gives it sessions that do not
    wait for the WAL flush: if PostgreSQL crashes, such a write may be lost, and the fence makes
    that safe (a lost claim leaves the child pending, a lost finish leaves a lease that expires
    and the child re-runs from its checkpoint). Checkpoints and every run transition stay
    durable, and a durable commit also flushes every earlier asynchronous one."""

    def __init__(self, engine: Engine, lease_engine: Engine | None = None) -> None:
        self.engine = engine
        self.lease_engine = lease_engine or engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def tx(self, autocommit: bool = False, lease: bool = False) -> Iterator[Connection]:
        """A transaction; or, with ``autocommit``, a connection whose every statement commits
        on its own. A child owner's writes are single conditional statements run that way, so
        an owner frozen mid-write (SIGSTOP, a paused VM) never keeps the row locked: the reaper
        skips locked rows and would otherwise never take the child over."""
        try:
            if lease:  # an autocommit engine: no isolation switch per checkout
                with self.lease_engine.connect() as c:
                    yield c
            elif autocommit:
                with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                    yield c
            else:
                with self.engine.begin() as conn:
                    yield conn
        except OperationalError as exc:
            raise unreachable(exc, self.engine) from None
        except ProgrammingError as exc:
            if "does not exist" in str(exc.orig):
                raise DatabaseUnavailable(
                    f"dtask's tables are missing in {mask(str(self.engine.url))}:"
                    " run `dtask migrate`"
                ) from None
            raise

    @contextmanager
    def held(self, hold_for: float, held_too_long: DtaskError) -> Iterator[Connection]:
        """A transaction PostgreSQL ends once it has sat idle for ``hold_for`` seconds, so a
        holder that hangs (SIGSTOP, swap, a paused VM) cannot keep its locks; the woken holder
        gets ``held_too_long`` and nothing of its transaction is recorded."""
        try:
            with self.tx() as conn:
                conn.execute(
                    sql("SELECT set_config('idle_in_transaction_session_timeout', :ms, true)"),
                    {"ms": str(int(hold_for * 1000))},
                )
                yield conn
        except InternalError as exc:
            if not isinstance(exc.orig, IdleInTransactionSessionTimeout):
                raise
            raise held_too_long from None
