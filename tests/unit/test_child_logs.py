"""A child's attempts as `dtask logs` shows them, and what --follow prints of each
(dtask/domain/logs.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.logs import LOST, AttemptLog, ChildNow, Follower, attempts
from dtask.domain.runs import ChildState


def child(state: ChildState, attempt: int, output: str | None = "done\n") -> ChildNow:
    return ChildNow(3, state, attempt, "host:9", output, None, None)


def logged(attempt: int, state: str, output: str = "out\n", worker: str = "host:1") -> AttemptLog:
    return AttemptLog(3, attempt, worker, state, output, 0, "boom" if state == "failed" else None)


def test_a_failed_attempt_then_a_success_from_the_child_s_own_row() -> None:
    found = attempts(child(ChildState.SUCCEEDED, 2), [logged(1, "failed"), logged(2, "running")])
    assert [(a.attempt, a.state, a.worker, a.output) for a in found] == [
        (1, "failed", "host:1", "out\n"),
        (2, "succeeded", "host:9", "done\n"),
    ]


def test_a_running_row_of_an_earlier_attempt_was_interrupted() -> None:
    found = attempts(child(ChildState.RUNNING, 2), [logged(1, "running"), logged(2, "running")])
    assert [a.state for a in found] == [LOST, "running"]
    found = attempts(child(ChildState.PENDING, 1), [logged(1, "running")])
    assert [a.state for a in found] == [LOST]


def test_a_child_that_failed_for_good_without_a_logged_row_shows_its_own() -> None:
    found = attempts(ChildNow(3, ChildState.FAILED, 1, "host:9", "x\n", "gave up", None), [])
    assert [(a.attempt, a.state, a.error) for a in found] == [(1, "failed", "gave up")]
    assert attempts(child(ChildState.PENDING, 0, None), []) == []


@given(st.lists(st.text(max_size=40), min_size=1, max_size=30), st.integers(1, 200))
def test_following_a_bounded_tail_prints_each_character_once(parts: list[str], limit: int) -> None:
    """Looking after each write at the last ``limit`` characters (and how many before them
    were not kept) prints exactly what was written, as far as each look still held it."""
    follower, printed, whole = Follower(), "", ""
    for part in parts:
        whole += part
        text = whole[-limit:]
        _, fresh, _ = follower.new(AttemptLog(0, 1, "w", "running", text, len(whole) - len(text)))
        printed += fresh
        assert whole.endswith(printed[-limit:] if printed else "")
    assert printed.endswith(whole[-limit:])
    assert len(printed) <= len(whole)
    if all(len(part) <= limit for part in parts):  # no look missed anything: all, once
        assert printed == whole


def test_a_success_after_a_running_tail_prints_what_follows() -> None:
    follower = Follower()
    assert follower.new(AttemptLog(0, 1, "w", "running", "a\nb\n", 0)) == (True, "a\nb\n", False)
    assert follower.new(AttemptLog(0, 1, "w", "succeeded", "a\nb\nc\n", 0)) == (False, "c\n", True)
    assert follower.new(AttemptLog(0, 1, "w", "succeeded", "a\nb\nc\n", 0)) == (False, "", False)
