"""Async children's pure parts: AsyncChildContext (awaited checkpoints, ``async for`` over
resume) and the worker's per-thread event loop that cancels a child asked to stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dtask.domain.async_context import AsyncChildContext, in_thread
from dtask.domain.context import ChildContext
from dtask.exceptions import ChildStopped
from dtask.worker import coroutines


@pytest.fixture(autouse=True)
def closed_loop() -> Iterator[None]:
    yield
    coroutines.close()


def context(
    state: Any = None, every: int = 3, stop: threading.Event | None = None
) -> tuple[AsyncChildContext, list[tuple[Any, int]]]:
    writes: list[tuple[Any, int]] = []  # (state, the writing thread)
    asked = stop or threading.Event()
    sync = ChildContext(
        run_id=1,
        index=0,
        attempt=1,
        checkpoint_state=state,
        writer=lambda s: writes.append((s, threading.get_ident())),
        checkpoint_interval=3600.0,
        checkpoint_every=every,
        stop_requested=asked.is_set,
    )
    return AsyncChildContext(sync), writes


def never() -> BaseException | None:
    return None


def test_async_for_over_resume_checkpoints_off_the_loop_and_skips_what_was_done() -> None:
    ctx, writes = context(state={"done": 2}, every=3)

    async def child() -> list[int]:
        return [i async for i in ctx.resume(range(10))]

    assert coroutines.run(child(), never) == list(range(2, 10))
    assert [s for s, _ in writes] == [{"done": 5}, {"done": 8}]
    assert all(thread != threading.get_ident() for _, thread in writes)
    assert ctx.sync.unsaved_checkpoint == {"done": 10}  # committed with the finish


def test_a_stop_between_items_commits_the_progress_then_raises_child_stopped() -> None:
    stop = threading.Event()
    ctx, writes = context(every=100, stop=stop)

    async def child() -> None:
        async for i in ctx.resume(range(10)):
            if i == 3:
                stop.set()

    with pytest.raises(ChildStopped):
        coroutines.run(child(), never)
    assert [s for s, _ in writes] == [{"done": 4}]


def test_await_checkpoint_commits_and_a_break_out_of_resume_leaves_nothing_behind() -> None:
    ctx, writes = context()

    async def child() -> str:
        async for i in ctx.resume(range(100)):
            if i == 1:
                break
        await ctx.checkpoint({"free": "form"})
        return "ok"

    assert coroutines.run(child(), never) == "ok"
    assert [s for s, _ in writes] == [{"free": "form"}]
    assert ctx.checkpoint_state == {"free": "form"}


def test_children_share_their_threads_loop_and_what_one_left_running_is_cancelled() -> None:
    loops: list[asyncio.AbstractEventLoop] = []
    left: list[asyncio.Task[None]] = []

    async def child() -> None:
        loops.append(asyncio.get_running_loop())
        left.append(asyncio.ensure_future(asyncio.sleep(3600)))

    coroutines.run(child(), never)
    coroutines.run(child(), never)
    assert loops[0] is loops[1] is coroutines.loop()
    assert all(task.cancelled() for task in left)


def test_a_child_asked_to_stop_is_cancelled_in_its_await_and_raises_why() -> None:
    asked = threading.Event()
    cleaned: list[str] = []

    async def child() -> None:
        asked.set()
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append("finally ran")

    def stop() -> BaseException | None:
        return ChildStopped("handed over") if asked.is_set() else None

    with pytest.raises(ChildStopped, match="handed over"):
        coroutines.run(child(), stop, poll=0.01)
    assert cleaned == ["finally ran"]


def test_a_cancel_the_child_did_itself_is_a_failure_not_a_stop() -> None:
    async def child() -> None:
        raise asyncio.CancelledError()

    with pytest.raises(RuntimeError, match="not by dtask"):
        coroutines.run(child(), never)


def test_a_cancelled_checkpoint_waits_for_its_write_to_end() -> None:
    started, release = threading.Event(), threading.Event()
    written: list[str] = []

    def write() -> None:
        started.set()
        release.wait(60)
        written.append("done")

    async def main() -> None:
        task = asyncio.ensure_future(in_thread(write))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not task.done(), "the cancel must wait for the write in flight"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert written == ["done"]

    coroutines.run(main(), never)


def test_run_from_inside_a_running_loop_uses_a_thread_of_its_own() -> None:
    async def child() -> int:
        return 7

    async def caller() -> int:
        return coroutines.run(child(), never)  # test mode under an ASGI app's loop

    assert asyncio.run(caller()) == 7
