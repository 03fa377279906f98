"""Reads for asyncio callers (``await run.aget()``), on psycopg 3's own async connections
(no SQLAlchemy asyncio, which needs greenlet: the base install has none), so a wait never
blocks the caller's event loop.

Not pooled: a pool's connections belong to the loop that opened them, and an application's
loop (a test's, a restarted server's) may end while they sit idle. A loop's waits share one
connection for as long as any waits (dtask/client/awaiting.py); a poll is one short statement,
never prepared (PgBouncer in transaction mode).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from dtask.db.engine import Limits, unreachable
from dtask.domain.runs import RunState
from dtask.exceptions import RunNotFound


def _conninfo(engine: Engine) -> str:
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def _unreachable(exc: psycopg.Error, engine: Engine) -> Exception:
    return unreachable(OperationalError(None, None, exc), engine)


class RunStates:
    """Run states read on one async connection."""

    def __init__(self, conn: psycopg.AsyncConnection[tuple[int, str]], engine: Engine) -> None:
        self._conn, self._engine = conn, engine

    async def states(self, run_ids: Sequence[int]) -> dict[int, RunState]:
        """The state of each of ``run_ids`` that exists (one statement, in autocommit)."""
        try:
            cursor = await self._conn.execute(
                "SELECT id, state FROM dtask_runs WHERE id = ANY(%s)", [list(run_ids)]
            )
            rows = await cursor.fetchall()
        except psycopg.OperationalError as exc:
            raise _unreachable(exc, self._engine) from None
        return {int(run_id): RunState(state) for run_id, state in rows}

    async def state_of(self, run_id: int) -> RunState:
        state = (await self.states([run_id])).get(run_id)
        if state is None:
            raise RunNotFound(f"no run with id {run_id} (see `dtask runs`)")
        return state


@asynccontextmanager
async def run_states(engine: Engine) -> AsyncIterator[RunStates]:
    """A connection to read run states on, closed on the way out (also when cancelled)."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            _conninfo(engine),
            autocommit=True,
            prepare_threshold=None,
            application_name=f"dtask:{os.getpid()}",
            **Limits().connect_args(),
        )
    except psycopg.OperationalError as exc:
        raise _unreachable(exc, engine) from None
    async with conn:
        yield RunStates(conn, engine)
