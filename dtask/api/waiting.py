"""Long polls, shared: every ``?wait=`` of this server waits on one loop that asks PostgreSQL
every :data:`LOOK_EVERY` seconds which of the awaited runs have finished, so 200 waiting
clients cost four small queries a second, not 400. Nothing is kept beyond the wait itself:
a server restart only ends the waits early (the clients ask again)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.concurrency import run_in_threadpool

from dtask import services

log = logging.getLogger("dtask.api")
LOOK_EVERY = 0.25


class Waits:
    def __init__(self) -> None:
        self._waiting: dict[int, set[asyncio.Future[None]]] = {}
        self._looking: asyncio.Task[None] | None = None

    async def until_finished(self, run_id: int, timeout: float) -> None:
        """Return when the run has finished or ``timeout`` seconds have passed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(run_id, set()).add(done)
        if self._looking is None or self._looking.done():
            self._looking = asyncio.create_task(self._look())
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done, timeout)
        finally:
            waiters = self._waiting.get(run_id)
            if waiters is not None:
                waiters.discard(done)
                if not waiters:
                    del self._waiting[run_id]

    async def _look(self) -> None:
        while self._waiting:
            await asyncio.sleep(LOOK_EVERY)
            try:
                finished = await run_in_threadpool(
                    services.store().runs.finished_among, list(self._waiting)
                )
            except Exception as exc:  # the waits end by their timeout; the next look may work
                log.warning("long polls: cannot look at the runs: %s", exc)
                continue
            for run_id in finished:
                for done in self._waiting.pop(run_id, set()):
                    if not done.done():
                        done.set_result(None)


waits = Waits()
