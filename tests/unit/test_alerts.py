"""Which alerts hold, judged from facts alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.alerts import (
    AlertKind,
    Facts,
    Limits,
    LossFact,
    RunFact,
    ScheduleFact,
    WorkerFact,
    duration,
    evaluate,
)

LIMITS = Limits(lost_after=8, idle_after=900, stalled_after=600, misfire_shown_for=3600)


def kinds(facts: Facts) -> set[tuple[str, str]]:
    return {a.key for a in evaluate(facts, LIMITS)}


def test_a_silent_worker_is_lost_and_a_long_idle_one_could_be_removed() -> None:
    facts = Facts(
        workers=(
            WorkerFact("gone", seen_ago=9, busy=2, idle_for=None),
            WorkerFact("idle", seen_ago=1, busy=0, idle_for=901),
            WorkerFact("resting", seen_ago=1, busy=0, idle_for=899),
            WorkerFact("working", seen_ago=1, busy=3, idle_for=None),
            WorkerFact("gone-idle", seen_ago=60, busy=0, idle_for=5000),
        )
    )
    assert kinds(facts) == {
        ("worker_lost", "gone"), ("worker_idle", "idle"), ("worker_lost", "gone-idle"),
    }  # fmt: skip
    lost = next(a for a in evaluate(facts, LIMITS) if a.subject == "gone")
    assert lost.message == (
        "worker gone stopped reporting 9 s ago (2 children were running on it; they resume"
        " elsewhere)"
    )


def test_runs_stalled_or_late_and_schedules_that_misfired() -> None:
    facts = Facts(
        runs=(
            RunFact(1, "t", quiet_for=601, late_by=None),
            RunFact(2, "t", quiet_for=10, late_by=30),
            RunFact(3, "t", quiet_for=10, late_by=None),
        ),
        schedules=(
            ScheduleFact("broken", error="slots after X not run: boom", misfire=None,
                         misfired_ago=None),
            ScheduleFact("missed", error=None, misfire="3 slot(s) were missed", misfired_ago=60),
            ScheduleFact("long-ago", error=None, misfire="missed", misfired_ago=3601),
        ),
    )  # fmt: skip
    assert kinds(facts) == {
        ("run_stalled", "1"), ("run_late", "2"), ("schedule_misfired", "broken"),
        ("schedule_misfired", "missed"),
    }  # fmt: skip


def test_a_broker_s_loss_is_an_alert_until_it_is_old() -> None:
    facts = Facts(
        losses=(
            LossFact("dtask", missing=180, resent=180, found_ago=5),
            LossFact("dtask.premium", missing=3, resent=3, found_ago=601),
        )
    )
    assert kinds(facts) == {("messages_lost", "dtask")}
    (alert,) = evaluate(facts, LIMITS)
    assert alert.message.startswith("queue dtask: 180 children sent were neither in the broker")
    later = Facts(losses=(LossFact("dtask", missing=180, resent=180, found_ago=300),))
    assert evaluate(later, LIMITS) == [alert]  # the same message: no rewrite every pass


worker_facts = st.builds(
    WorkerFact,
    name=st.sampled_from(["a", "b", "c"]),
    seen_ago=st.floats(0, 10_000),
    busy=st.integers(0, 8),
    idle_for=st.none() | st.floats(0, 10_000),
)
run_facts = st.builds(
    RunFact,
    id=st.integers(1, 5),
    template=st.just("t"),
    quiet_for=st.floats(0, 10_000),
    late_by=st.none() | st.floats(-100, 10_000),
)


@given(st.lists(worker_facts, max_size=8), st.lists(run_facts, max_size=8))
def test_at_most_one_alert_per_kind_and_subject_in_a_stable_order(
    workers: list[WorkerFact], runs: list[RunFact]
) -> None:
    facts = Facts(tuple(workers), tuple(runs))
    found = evaluate(facts, LIMITS)
    assert len({a.key for a in found}) == len(found)
    assert found == sorted(found)
    assert evaluate(Facts(tuple(reversed(workers)), tuple(reversed(runs))), LIMITS) == found or (
        len({w.name for w in workers}) < len(workers) or len({r.id for r in runs}) < len(runs)
    )  # the same facts in another order: the same alerts (a repeated subject may differ)
    for a in found:
        assert a.kind in AlertKind and a.message


@given(st.floats(0, 10**7))
def test_durations_read_short(seconds: float) -> None:
    text = duration(seconds)
    assert text.endswith((" s", " min", " h")) and len(text) <= 10
