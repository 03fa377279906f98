"""Async children: an ``async def`` child function runs to completion on its thread's event
loop (in a prefork pool process, one loop per process), made when first needed and kept: a
loop per child (``asyncio.run``) would cost a loop's setup and teardown each time.

The child runs as a task that is cancelled once the worker must let go of it (a hand-over,
a cancel, the execution cap, a lost lease): an ``await asyncio.sleep(...)`` ends there. What
the child left running on the loop is cancelled when it returns, as ``asyncio.run`` does.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
POLL = 0.05  # seconds between two looks at whether the child must stop

_local = threading.local()


def loop() -> asyncio.AbstractEventLoop:
    """This thread's loop for children; a forked process makes its own."""
    held: tuple[int, asyncio.AbstractEventLoop] | None = getattr(_local, "loop", None)
    if held is None or held[0] != os.getpid() or held[1].is_closed():
        held = _local.loop = (os.getpid(), asyncio.new_event_loop())
    return held[1]


def close() -> None:
    """Close this thread's loop, if it has one (a thread that ends; a test)."""
    held: tuple[int, asyncio.AbstractEventLoop] | None = getattr(_local, "loop", None)
    _local.loop = None
    if held is not None and held[0] == os.getpid() and not held[1].is_closed():
        held[1].run_until_complete(held[1].shutdown_default_executor())
        held[1].close()


def run(
    coroutine: Coroutine[Any, Any, T],
    stop: Callable[[], BaseException | None],
    poll: float = POLL,
) -> T:
    """Run ``coroutine`` to its end on this thread's loop. ``stop()`` is asked every ``poll``
    seconds: the exception it returns is raised here once the cancelled task has ended."""
    if _running_here():  # a caller's own loop runs in this thread (test mode under asyncio)
        return _in_own_thread(coroutine, stop, poll)
    here = loop()
    try:
        return here.run_until_complete(_supervised(coroutine, stop, poll))
    finally:
        _cancel_the_rest(here)


async def _supervised(
    coroutine: Coroutine[Any, Any, T], stop: Callable[[], BaseException | None], poll: float
) -> T:
    task = asyncio.ensure_future(coroutine)
    why: BaseException | None = None
    while not task.done():
        await asyncio.wait([task], timeout=poll)
        if why is None and not task.done():
            why = stop()
            if why is not None:
                task.cancel()
    if why is not None and task.cancelled():
        raise why
    try:
        return task.result()
    except asyncio.CancelledError as exc:  # the child's own doing: a failed attempt
        raise RuntimeError("the child's coroutine was cancelled (not by dtask)") from exc


def _cancel_the_rest(here: asyncio.AbstractEventLoop) -> None:
    rest = asyncio.all_tasks(here)
    if not rest:
        return
    for task in rest:
        task.cancel()
    here.run_until_complete(asyncio.gather(*rest, return_exceptions=True))


def _running_here() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_own_thread(
    coroutine: Coroutine[Any, Any, T], stop: Callable[[], BaseException | None], poll: float
) -> T:
    done: list[T] = []
    failed: list[BaseException] = []

    def body() -> None:
        try:
            done.append(run(coroutine, stop, poll))
        except BaseException as exc:
            failed.append(exc)
        finally:
            close()

    thread = threading.Thread(target=body, name="dtask-async-child")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return done[0]
