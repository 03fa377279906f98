from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import dtask
from dtask.domain.runs import (
    ChildCounts,
    ChildState,
    ClaimRefusal,
    RunState,
    RunStatus,
    can_move,
    can_move_child,
    outcome,
    refuse_claim,
    sources,
)


@pytest.mark.parametrize(
    ("current", "target", "allowed"),
    [
        (RunState.PENDING, RunState.SPLITTING, True),
        (RunState.SPLITTING, RunState.RUNNING, True),
        (RunState.RUNNING, RunState.SUCCEEDED, True),
        (RunState.RUNNING, RunState.FAILED, True),
        (RunState.PENDING, RunState.RUNNING, False),
        (RunState.SUCCEEDED, RunState.FAILED, False),
        (RunState.FAILED, RunState.RUNNING, False),
        (RunState.CANCELLED, RunState.SPLITTING, True),
        (RunState.RUNNING, RunState.PENDING, False),
    ],
)
def test_run_transitions(current: RunState, target: RunState, allowed: bool) -> None:
    assert can_move(current, target) is allowed


def test_only_a_rerun_leaves_a_finished_state() -> None:
    assert not any(can_move(RunState.SUCCEEDED, t) for t in RunState)
    for state in (RunState.FAILED, RunState.CANCELLED):
        assert {t for t in RunState if can_move(state, t)} == {
            RunState.WAITING,
            RunState.PENDING,
            RunState.SPLITTING,
        }
    for child_state in ChildState:
        if child_state.finished:
            assert not any(can_move_child(child_state, t) for t in ChildState)


def test_sources_of_a_final_state() -> None:
    assert set(sources(RunState.SUCCEEDED)) == {"running"}
    assert set(sources(RunState.FAILED)) == {"waiting", "pending", "splitting", "running"}


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        ({"succeeded": 3}, RunState.SUCCEEDED),
        ({"succeeded": 2, "failed": 1}, RunState.FAILED),
        ({"succeeded": 2, "running": 1}, None),
        ({"pending": 1, "failed": 1}, None),
        ({}, None),
    ],
)
def test_outcome_waits_for_every_child(states: dict[str, int], expected: RunState | None) -> None:
    assert outcome(ChildCounts.from_states(states)) is expected


@pytest.mark.parametrize(
    ("state", "attempt", "leased", "expected"),
    [
        (None, 0, False, ClaimRefusal.GONE),
        (ChildState.SUCCEEDED, 1, False, ClaimRefusal.DONE),
        (ChildState.FAILED, 3, False, ClaimRefusal.FAILED),
        (ChildState.RUNNING, 1, True, ClaimRefusal.BUSY),
        (ChildState.RUNNING, 3, False, ClaimRefusal.EXHAUSTED),
        (ChildState.PENDING, 3, False, ClaimRefusal.EXHAUSTED),
        (ChildState.PENDING, 1, False, ClaimRefusal.BUSY),
    ],
)
def test_refuse_claim(
    state: ChildState | None, attempt: int, leased: bool, expected: ClaimRefusal
) -> None:
    assert refuse_claim(state, attempt, 3, leased) is expected


def test_children_of_a_cancelled_run_stay_put_but_finished_ones_report_again() -> None:
    assert refuse_claim(ChildState.PENDING, 0, 3, False, run_active=False) is ClaimRefusal.INACTIVE
    assert refuse_claim(ChildState.SUCCEEDED, 1, 3, False, run_active=False) is ClaimRefusal.DONE


def test_status_json_has_the_documented_shape() -> None:
    status = RunStatus(
        id=1,
        template="t",
        key="k",
        state=RunState.RUNNING,
        variables={"n": 1},
        children=ChildCounts.from_states({"running": 1, "succeeded": 2}),
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        finished_at=None,
        error=None,
    )
    data = status.as_json()
    assert list(data) == [
        "id", "template", "key", "state", "variables", "children", "created_at", "finished_at",
        "error", "schedule", "slot", "client", "priority", "deadline", "start_after", "result",
        "late", "tier", "notify", "after", "waiting_for", "slots", "concurrency_key",
        "max_concurrent",
    ]  # fmt: skip
    assert data["children"] == {
        "total": 3, "pending": 0, "running": 1, "succeeded": 2, "failed": 0,
    }  # fmt: skip


@pytest.mark.parametrize("call", [dtask.submit, dtask.submit_many])
def test_a_misspelled_submit_option_is_refused_not_ignored(call: Any) -> None:
    """The options travel as ``**options`` (one list of them, RunOptions): a name not in it is
    the TypeError Python gives for a keyword a signature lacks, before anything is read."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'prioirty'"):
        call("any", {} if call is dtask.submit else [{}], prioirty=3)
