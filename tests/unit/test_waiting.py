"""Why a run waits (dtask/domain/waiting.py): each reason from its facts, and the order in
which a run meets them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.runs import RunState
from dtask.domain.waiting import (
    Facts,
    KeyFacts,
    Reason,
    Upstream,
    Worker,
    duration,
    explain,
    waiting_json,
)

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
W1 = Worker("w1", ("dtask",), 4, 0, ("squares", "cubes"))
RUNNING = Facts(
    run_id=7, state=RunState.RUNNING, template="squares", queue="dtask", client="acme",
    priority=5, now=NOW, unsent=10, workers=[W1],
)  # fmt: skip


def reason(facts: Facts) -> Reason | None:
    found = explain(facts)
    return None if found is None else found.reason


def test_a_finished_or_splitting_run_or_one_with_all_its_children_running_does_not_wait() -> None:
    for state in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.SPLITTING):
        assert explain(replace(RUNNING, state=state)) is None
    assert explain(replace(RUNNING, unsent=0, queued=0, running=3)) is None
    assert waiting_json(None) == {"waiting_because": None, "waiting_reason": None}


def test_upstreams_are_named_with_their_progress_and_the_rest_counted() -> None:
    ups = [Upstream(812, RunState.RUNNING, 40, 100), Upstream(813, RunState.PENDING, 0, 0)]
    found = explain(replace(RUNNING, state=RunState.WAITING, upstreams=ups))
    assert found is not None and found.reason is Reason.UPSTREAM
    assert found.text == "waits for runs 812 (running, 40 %), 813 (pending)"
    many = [Upstream(i, RunState.PENDING, 0, 0) for i in range(1, 9)]
    found = explain(replace(RUNNING, state=RunState.WAITING, upstreams=many))
    assert found is not None and found.text.endswith("5 (pending) and 3 more")


def test_a_concurrency_key_names_its_limit_its_holders_and_the_runs_ahead() -> None:
    key = KeyFacts("export:acme", 2, 7, (3, 4, 5, 6, 8), 1)
    found = explain(replace(RUNNING, state=RunState.WAITING, key=key))
    assert found is not None and found.reason is Reason.CONCURRENCY_KEY
    assert found.text == (
        "concurrency key 'export:acme' of client acme is at max_concurrent 2: 7 unfinished"
        " (runs 3, 4, 5, 6, 8 and 2 more); 1 of its runs wait ahead of this one; it starts"
        " when one finishes"
    )
    ups = [Upstream(812, RunState.RUNNING, 40, 100)]  # its upstreams come first
    found = explain(replace(RUNNING, state=RunState.WAITING, key=key, upstreams=ups))
    assert found is not None and found.reason is Reason.UPSTREAM


def test_a_start_in_the_future_comes_before_the_workers() -> None:
    found = explain(
        replace(
            RUNNING,
            state=RunState.PENDING,
            workers=[],
            start_after=NOW + timedelta(minutes=4, seconds=10),
        )
    )
    assert found is not None and found.reason is Reason.START_AFTER
    assert "(in 4 min 10 s)" in found.text
    assert (
        reason(replace(RUNNING, start_after=NOW - timedelta(seconds=1))) is not Reason.START_AFTER
    )


def test_workers_queues_and_templates() -> None:
    assert reason(replace(RUNNING, workers=[])) is Reason.NO_WORKER
    other = Worker("w2", ("gpu", "dtask.premium"), 2, 0, None)
    found = explain(replace(RUNNING, workers=[other]))
    assert found is not None and found.reason is Reason.NO_QUEUE_WORKER
    assert found.text == "no live worker consumes queue dtask (workers consume: dtask.premium, gpu)"
    found = explain(replace(RUNNING, template="halves"))
    assert found is not None and found.reason is Reason.UNKNOWN_TEMPLATE
    assert found.text == "no live worker knows template 'halves' (workers have: cubes, squares)"
    found = explain(replace(RUNNING, template="square"))
    assert found is not None and found.text.endswith(
        "(workers have: squares, cubes)"
    )  # close first
    # one worker that did not say what it knows may know it: nothing to say about templates
    told_nothing = replace(W1, name="w2", templates=None)
    assert (
        reason(replace(RUNNING, template="halves", workers=[W1, told_nothing])) is Reason.DISPATCH
    )


def test_changed_files_say_the_workers_run_older_code() -> None:
    stale = replace(W1, changed=("/srv/app/myjobs.py",))
    found = explain(replace(RUNNING, template="halves", workers=[stale]))
    assert found is not None and found.reason is Reason.STALE_CODE
    assert "workers run an older version of myjobs.py (changed since w1 started" in found.text
    assert "--reload" in found.text


def test_the_clients_cap_then_priority_then_busy_slots() -> None:
    capped = replace(RUNNING, max_running=4, client_out=4, higher=3200, queue_running=4)
    found = explain(capped)
    assert found is not None and found.reason is Reason.CLIENT_MAX_RUNNING
    assert found.text == "client acme is at --max-running 4 (4 children running or queued)"
    found = explain(replace(capped, client_out=3))
    assert (
        found is not None
        and found.text == "behind 3,200 children of higher priority in queue dtask"
    )
    found = explain(replace(capped, client_out=3, higher=0, others=2))
    assert found is not None and found.reason is Reason.SLOTS_BUSY
    assert (
        found.text == "all 4 slots of queue dtask are busy, shared fairly with 2 other runs;"
        " 10 of its children wait"
    )


def test_free_slots_mean_the_next_pass_or_a_worker_takes_them() -> None:
    assert reason(replace(RUNNING, queued=2, unsent=0)) is Reason.QUEUED
    assert reason(RUNNING) is Reason.DISPATCH
    assert reason(replace(RUNNING, state=RunState.PENDING, unsent=0)) is Reason.SPLIT_QUEUED
    busy = replace(RUNNING, state=RunState.PENDING, queue_running=4)
    found = explain(busy)
    assert found is not None and found.text.startswith(
        "its split waits for a free slot: all 4 slots"
    )


@given(st.integers(min_value=0, max_value=10 * 365 * 86400))
def test_a_duration_reads_back_to_its_seconds_within_its_least_unit(seconds: int) -> None:
    unit = {"s": 1, "min": 60, "h": 3600, "d": 86400}
    words = duration(seconds).split()
    total = sum(int(n) * unit[u] for n, u in zip(words[::2], words[1::2], strict=True))
    shown_to = {"s": 1, "min": 1, "h": 60, "d": 3600}[words[1]]  # its largest unit's
    assert total <= seconds < total + shown_to


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(12, "12 s"), (250, "4 min 10 s"), (3600, "1 h"), (11100, "3 h 5 min"), (187200, "2 d 4 h")],
)
def test_durations_in_words(seconds: float, text: str) -> None:
    assert duration(seconds) == text
