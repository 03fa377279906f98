"""ChildContext.resume: skips what was done, throttles checkpoint writes."""

from __future__ import annotations

from typing import Any

import pytest

from dtask.domain.context import ChildContext
from dtask.exceptions import LeaseLost


def context(
    state: Any = None, every: int = 10, interval: float = 3600.0
) -> tuple[ChildContext, list[Any]]:
    writes: list[Any] = []
    ctx = ChildContext(
        run_id=1,
        index=0,
        attempt=1,
        checkpoint_state=state,
        writer=writes.append,
        checkpoint_interval=interval,
        checkpoint_every=every,
    )
    return ctx, writes


def test_resume_checkpoints_every_n_items_not_every_item() -> None:
    ctx, writes = context(every=10)
    assert list(ctx.resume(range(1, 36))) == list(range(1, 36))
    assert writes == [{"done": 10}, {"done": 20}, {"done": 30}]
    assert ctx.unsaved_checkpoint == {"done": 35}


def test_resume_skips_what_an_earlier_attempt_finished() -> None:
    ctx, _ = context(state={"done": 20})
    assert list(ctx.resume(range(1, 36))) == list(range(21, 36))
    ctx, _ = context(state={"done": 2})
    assert list(ctx.resume(iter("abcde"))) == ["c", "d", "e"]


def test_resume_checkpoints_by_time() -> None:
    ctx, writes = context(every=10**9, interval=0.0)
    list(ctx.resume(range(3)))
    assert writes == [{"done": 1}, {"done": 2}, {"done": 3}]


def test_free_form_checkpoint() -> None:
    ctx, writes = context()
    ctx.checkpoint({"cursor": "abc"})
    assert ctx.checkpoint_state == {"cursor": "abc"}
    assert writes == [{"cursor": "abc"}]
    with pytest.raises(ValueError, match="not written by resume"):
        list(ctx.resume(range(3)))


def test_a_lost_lease_stops_the_loop() -> None:
    def refuse(state: Any) -> None:
        raise LeaseLost("taken over")

    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None, writer=refuse,
        checkpoint_interval=3600, checkpoint_every=2,
    )  # fmt: skip
    seen = []
    with pytest.raises(LeaseLost):
        for i in ctx.resume(range(10)):
            seen.append(i)
    assert seen == [0, 1]


def test_a_checkpoint_after_the_lease_is_lost_writes_nothing_and_stops_the_child() -> None:
    writes: list[Any] = []
    lost = False
    ctx = ChildContext(
        run_id=1,
        index=4,
        attempt=1,
        checkpoint_state=None,
        writer=writes.append,
        checkpoint_interval=3600.0,
        checkpoint_every=10,
        lease_lost=lambda: lost,
    )
    ctx.checkpoint({"step": 1})
    lost = True  # e.g. the lease ran out while the worker was cut off from PostgreSQL
    with pytest.raises(LeaseLost, match="child 4 was taken over"):
        ctx.checkpoint({"step": 2})
    assert writes == [{"step": 1}]
