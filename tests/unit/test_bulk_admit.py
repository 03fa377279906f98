"""Which runs of a bulk submit a client's rates admit: exactly those a submit of each, one
after the other, would have had accepted."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.bulk import Outcome, Refused, Submitted, Window, admit, shown_wait
from dtask.domain.clients import Rate, retry_after

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def one_by_one(windows: list[Window], costs: list[list[int]]) -> list[Refused | None]:
    """The reference: each run checked as a submit of its own, the ones before it counted."""
    held = [list(w.entries) for w in windows]
    found: list[Refused | None] = []
    for cost in costs:
        waits = [retry_after(held[w], windows[w].rate, cost[w], NOW) for w in range(len(windows))]
        refused = next((w for w, wait in enumerate(waits) if wait is not None), None)
        if refused is None:
            for w in range(len(windows)):
                held[w].append((NOW, cost[w]))
            found.append(None)
        else:
            wait = waits[refused]
            assert wait is not None
            found.append(Refused(refused, wait))
    return found


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Window], list[list[int]]]:
    windows = []
    for _ in range(draw(st.integers(1, 2))):
        rate = Rate(draw(st.integers(1, 12)), draw(st.sampled_from(["s", "m", "h"])))
        ages = sorted(draw(st.lists(st.floats(0, 0.99), max_size=8)), reverse=True)
        entries = [
            (NOW - timedelta(seconds=age * rate.seconds), draw(st.integers(1, 4))) for age in ages
        ]
        windows.append(Window(rate, entries))
    costs = draw(st.lists(st.lists(st.integers(1, 5), min_size=2, max_size=2), max_size=20))
    return windows, costs


@given(cases())
def test_a_bulk_admits_what_submits_one_by_one_would(
    case: tuple[list[Window], list[list[int]]],
) -> None:
    windows, costs = case
    assert admit(windows, costs, NOW) == one_by_one(windows, costs)


def test_a_refused_run_does_not_count_and_a_cheaper_one_after_it_may_fit() -> None:
    window = Window(Rate(5, "m"), [(NOW - timedelta(seconds=10), 2)])
    found = admit([window], [[2], [2], [1]], NOW)
    assert found[0] is None and found[2] is None
    assert found[1] == Refused(0, 50.0)  # the entry of 10 s ago leaves the window in 50 s
    assert admit([Window(Rate(3, "m"), [])], [[4]], NOW) == [Refused(0, math.inf)]


def test_an_outcome_as_json() -> None:
    assert Submitted(3, Outcome.CREATED, run_id=7).as_json() == {
        "index": 3, "outcome": "created", "run_id": 7,
    }  # fmt: skip
    limited = Submitted(4, Outcome.LIMIT_EXCEEDED, error="limit exceeded", retry_after=None)
    assert limited.as_json()["retry_after"] is None
    assert (shown_wait(0.2), shown_wait(math.inf)) == (1.0, None)
