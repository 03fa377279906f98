"""What an ``async def`` child function sees: ``ChildContext`` whose writes are awaited.

A checkpoint is a PostgreSQL write: ``await ctx.checkpoint(state)`` runs it off the event
loop (``offload``), so the child's other tasks keep running meanwhile. No SQL here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from functools import partial
from typing import Any, TypeVar

from dtask.domain.context import ChildContext, Step

T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]


async def in_thread(call: Callable[[], T]) -> T:
    """``call()`` in a thread of the loop's executor. A cancel of the awaiting task waits for
    the call to end before it is raised: a checkpoint is committed or not, never still in
    flight while the worker lets go of the child."""
    import asyncio  # here: `import dtask` would pay for asyncio otherwise

    running = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        if not running.cancelled():
            running.exception()  # seen: the cancel is what the child gets
        raise


class AsyncChildContext:
    """Handed to an ``async def`` child function as its first argument: ``ChildContext``'s
    API, with ``await ctx.checkpoint(state)`` and ``async for item in ctx.resume(items)``.
    ``should_stop()``, ``state``, ``checkpoint_state`` and ``log`` are as there. When the
    worker must let go of the child (a hand-over, a cancel, its execution cap) the task
    running it is cancelled: an ``await`` in it raises ``asyncio.CancelledError``."""

    def __init__(self, sync: ChildContext, offload: Offload[Any] = in_thread) -> None:
        self.sync = sync  # the context the worker reads (what resume has not written yet)
        self._offload = offload
        import asyncio

        self._writing = asyncio.Lock()

    @property
    def run_id(self) -> int:
        return self.sync.run_id

    @property
    def index(self) -> int:
        return self.sync.index

    @property
    def attempt(self) -> int:
        return self.sync.attempt

    @property
    def template(self) -> str:
        return self.sync.template

    @property
    def state(self) -> dict[str, Any]:
        return self.sync.state

    @property
    def checkpoint_state(self) -> Any:
        return self.sync.checkpoint_state

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return self.sync.log

    def should_stop(self) -> bool:
        return self.sync.should_stop()

    async def checkpoint(self, state: Any) -> None:
        """Commit ``state`` (JSON), off the loop; raises as ``ChildContext.checkpoint``."""
        async with self._writing:  # one write at a time, in the order they were asked
            await self._offload(lambda: self.sync.checkpoint(state))

    async def give_away(self, done: int | None) -> int | None:
        """``ChildContext.give_away``, off the loop (it may write)."""
        return await self._offload(lambda: self.sync.give_away(done))  # type: ignore[no-any-return]

    def resume(
        self,
        items: Iterable[T],
        *,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | None = None,
    ) -> AsyncIterator[T]:
        """``async for item in ctx.resume(items)``: ``ChildContext.resume`` whose
        checkpoints are awaited. ``items`` is a plain iterable, the same on every attempt."""
        return _Resumed(self, self.sync.steps(items, checkpoint_every, checkpoint_interval))


class _Resumed(AsyncIterator[T]):
    """A class, not an async generator: one left unfinished (a ``break``) needs no
    finalizing on the loop."""

    def __init__(self, ctx: AsyncChildContext, steps: Iterator[tuple[Step, Any]]) -> None:
        self._ctx, self._steps = ctx, steps

    def __aiter__(self) -> _Resumed[T]:
        return self

    async def __anext__(self) -> T:
        ctx = self._ctx
        for step, value in self._steps:
            if step is Step.ITEM:
                return value  # type: ignore[no-any-return]
            if step is Step.WRITE:
                await ctx.checkpoint(value)
            else:
                await ctx._offload(partial(ctx.sync.cut_at, value))
        raise StopAsyncIteration
