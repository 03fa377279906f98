"""ChildContext.resume: skips what was done, throttles checkpoint writes."""

from __future__ import annotations

from typing import Any

import pytest

from dtask.domain.context import ChildContext
from dtask.exceptions import ChildStopped, InvalidCheckpoint, LeaseLost


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


def test_state_is_committed_with_each_checkpoint_resume_writes() -> None:
    ctx, writes = context(every=2)
    ctx.state["total"] = 0
    for i in ctx.resume(range(1, 6)):
        ctx.state["total"] += i
    assert writes == [
        {"done": 2, "state": {"total": 3}},
        {"done": 4, "state": {"total": 10}},
    ]
    # what the finish commits: every item, and the whole total
    assert ctx.unsaved_checkpoint == {"done": 5, "state": {"total": 15}}
    assert ctx.state == {"total": 15}


def test_a_resumed_attempt_returns_the_whole_total() -> None:
    """The first attempt dies after its checkpoint at 4 items (its 5th item's work is lost with
    it); the second starts from that checkpoint, state included, and returns sum(1..10)."""

    def child(ctx: ChildContext) -> int:
        ctx.state.setdefault("total", 0)
        for i in ctx.resume(range(1, 11)):
            if ctx.attempt == 1 and i == 6:
                raise KeyboardInterrupt  # stands for the SIGKILL
            ctx.state["total"] += i
        return int(ctx.state["total"])

    first, writes = context(every=2)
    with pytest.raises(KeyboardInterrupt):
        child(first)
    assert writes[-1] == {"done": 4, "state": {"total": 10}}  # 1+2+3+4; 5 was not committed
    second = ChildContext(
        run_id=1, index=0, attempt=2, checkpoint_state=writes[-1], writer=writes.append,
        checkpoint_interval=3600, checkpoint_every=2,
    )  # fmt: skip
    assert child(second) == 55


def test_a_committed_state_is_a_copy_not_the_live_dict() -> None:
    ctx, writes = context(every=1)
    ctx.state["seen"] = []
    for i in ctx.resume(range(3)):
        ctx.state["seen"].append(i)
    assert writes == [
        {"done": 1, "state": {"seen": [0]}},
        {"done": 2, "state": {"seen": [0, 1]}},
        {"done": 3, "state": {"seen": [0, 1, 2]}},
    ]
    assert ctx.checkpoint_state == {"done": 3, "state": {"seen": [0, 1, 2]}}


def test_a_checkpoint_of_the_old_format_resumes_with_an_empty_state() -> None:
    ctx, writes = context(state={"done": 3}, every=1)
    assert ctx.state == {}
    ctx.state["total"] = 100
    assert list(ctx.resume(range(5))) == [3, 4]
    assert writes[0] == {"done": 4, "state": {"total": 100}}


def test_without_state_resume_writes_the_old_format() -> None:
    ctx, writes = context(every=1)
    list(ctx.resume(range(2)))
    assert writes == [{"done": 1}, {"done": 2}]


def test_a_state_that_is_not_json_or_too_big_is_refused_at_its_checkpoint() -> None:
    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None, writer=lambda s: None,
        checkpoint_interval=3600, checkpoint_every=1, max_checkpoint=100,
    )  # fmt: skip
    ctx.state["blob"] = "x" * 200
    with pytest.raises(InvalidCheckpoint, match="DTASK_MAX_CHECKPOINT"):
        list(ctx.resume(range(2)))
    ctx, _ = context(every=1)
    ctx.state["when"] = object()
    with pytest.raises(InvalidCheckpoint, match="not JSON"):
        list(ctx.resume(range(2)))
    ctx, _ = context(every=1)
    ctx.state[1] = "int key"  # JSON would bring it back as "1": refused, not silently changed
    with pytest.raises(InvalidCheckpoint, match="keys"):
        list(ctx.resume(range(2)))


def test_a_stop_commits_the_state_with_its_offset() -> None:
    writes: list[Any] = []
    stop = False
    ctx = ChildContext(
        run_id=1, index=0, attempt=1, checkpoint_state=None, writer=writes.append,
        checkpoint_interval=3600, checkpoint_every=100, stop_requested=lambda: stop,
    )  # fmt: skip
    ctx.state["total"] = 0
    with pytest.raises(ChildStopped):
        for i in ctx.resume(range(1, 10)):
            ctx.state["total"] += i
            stop = i == 3
    assert writes == [{"done": 3, "state": {"total": 6}}]
