"""Reads for asyncio callers (``await run.aget()``), on psycopg 3's async connections through
SQLAlchemy's asyncio extension, so a wait never blocks the caller's event loop.

Not pooled: a pool's connections belong to the loop that opened them, and an application's
loop (a test's, a restarted server's) may end while they sit idle. A loop's waits share one
connection for as long as any waits (dtask/client/awaiting.py); a poll is one short statement.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from dtask.db.engine import Limits, unreachable
from dtask.domain.runs import RunState
from dtask.exceptions import RunNotFound

_engines: dict[tuple[int, str], AsyncEngine] = {}
_lock = threading.Lock()


def async_engine(engine: Engine) -> AsyncEngine:
    """The async twin of ``engine`` (same URL and connection bounds), one per process."""
    url = engine.url.render_as_string(hide_password=False)
    key = (os.getpid(), url)
    with _lock:
        found = _engines.get(key)
        if found is None:
            connect_args = {**Limits().connect_args(), "application_name": f"dtask:{os.getpid()}"}
            found = _engines[key] = create_async_engine(
                engine.url, poolclass=NullPool, connect_args=connect_args
            )
        return found


class RunStates:
    """Run states read on one async connection."""

    def __init__(self, conn: AsyncConnection, engine: Engine) -> None:
        self._conn, self._engine = conn, engine

    async def states(self, run_ids: Sequence[int]) -> dict[int, RunState]:
        """The state of each of ``run_ids`` that exists (one statement, in autocommit)."""
        try:
            rows = await self._conn.execute(
                text("SELECT id, state FROM dtask_runs WHERE id = ANY(:ids)"),
                {"ids": list(run_ids)},
            )
        except OperationalError as exc:
            raise unreachable(exc, self._engine) from None
        return {int(r.id): RunState(r.state) for r in rows}

    async def state_of(self, run_id: int) -> RunState:
        state = (await self.states([run_id])).get(run_id)
        if state is None:
            raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
        return state


@asynccontextmanager
async def run_states(engine: Engine) -> AsyncIterator[RunStates]:
    """A connection to read run states on, closed on the way out (also when cancelled)."""
    try:
        async with async_engine(engine).connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield RunStates(conn, engine)
    except OperationalError as exc:
        raise unreachable(exc, engine) from None
