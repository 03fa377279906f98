"""Waiting for runs from asyncio code (``await run.aget()``): the states of every run a loop
waits for are polled together, one statement on one async connection (dtask/db/aio.py) per
poll, by one task of that loop; so an ASGI app's event loop goes on serving while it waits,
and a hundred waits cost one connection, not a hundred."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from dtask import services
from dtask.db.aio import run_states
from dtask.domain.runs import RunState, RunStatus
from dtask.exceptions import RunCancelled, RunFailed, RunNotFound, WaitTimeout

FIRST_POLL = 0.05  # after a new wait joins; each empty poll doubles it, up to the waits' poll


def result_of(status: RunStatus) -> Any:
    """A finished run's result, or RunFailed (RunCancelled) with its error, as ``get`` says."""
    if status.state is RunState.CANCELLED:
        raise RunCancelled(f"run {status.id} was cancelled")
    if status.state is RunState.FAILED:
        raise RunFailed(f"run {status.id} failed: {status.error}")
    return status.result


class _Watch:
    """The runs one loop waits for, and the task that polls them while there are any."""

    def __init__(self) -> None:
        self.waits: dict[int, set[asyncio.Future[RunState]]] = {}
        self.seen: dict[int, RunState] = {}
        self.poll = 0.5
        self.delay = FIRST_POLL
        self.task: asyncio.Task[None] | None = None

    def add(self, run_id: int, poll: float) -> asyncio.Future[RunState]:
        done: asyncio.Future[RunState] = asyncio.get_running_loop().create_future()
        self.waits.setdefault(run_id, set()).add(done)
        self.poll, self.delay = min(self.poll, poll), min(FIRST_POLL, poll)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._polls())
        return done

    def remove(self, run_id: int, done: asyncio.Future[RunState]) -> None:
        futures = self.waits.get(run_id, set())
        futures.discard(done)
        if not futures:
            self.waits.pop(run_id, None)
            self.seen.pop(run_id, None)

    async def _polls(self) -> None:
        try:
            store = await asyncio.to_thread(services.store)  # made once per process
            async with run_states(store.engine) as reads:
                while self.waits:
                    states = await reads.states(list(self.waits))
                    for run_id in list(self.waits):
                        state = states.get(run_id)
                        if state is not None:
                            self.seen[run_id] = state
                        if state is None or state.finished:
                            self._settle(run_id, state)
                    await asyncio.sleep(self.delay)
                    self.delay = min(self.delay * 2, self.poll)
        except Exception as exc:  # DatabaseUnavailable: every wait gets it
            for futures in self.waits.values():
                for done in futures:
                    if not done.done():
                        done.set_exception(exc)

    def _settle(self, run_id: int, state: RunState | None) -> None:
        for done in self.waits.get(run_id, set()):
            if done.done():
                continue
            if state is None:
                done.set_exception(RunNotFound(f"no run with id {run_id} (see `dtask runs`)"))
            else:
                done.set_result(state)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = weakref.WeakKeyDictionary()


async def finished(run_id: int, timeout: float | None = None, poll: float = 0.5) -> RunState:
    """Wait until the run has finished; its state. WaitTimeout after ``timeout`` seconds (the
    run keeps going)."""
    watch = _watches.setdefault(asyncio.get_running_loop(), _Watch())
    done = watch.add(run_id, poll)
    try:
        return await asyncio.wait_for(done, timeout)
    except TimeoutError:
        state = watch.seen.get(run_id)
        still = f"still {state.value}" if state is not None else "not finished"
        raise WaitTimeout(f"run {run_id} is {still} after {timeout:g} s") from None
    finally:
        watch.remove(run_id, done)


class AsyncWaits:
    """``Run``'s asyncio verbs."""

    id: int

    def status(self) -> RunStatus:
        raise NotImplementedError

    async def aget(self, timeout: float | None = None, *, poll: float = 0.5) -> Any:
        """``get`` for asyncio code: waits without blocking the event loop (its polls are
        async queries, shared by the loop's waits; the final status, one read, is taken in a
        thread)."""
        await finished(self.id, timeout, poll)
        return result_of(await asyncio.to_thread(self.status))
