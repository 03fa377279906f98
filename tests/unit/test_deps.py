"""The pure side of dependencies: a new run's state from its upstreams', the upstream ids a
submit may name, and the terminal drawing of a run's graph."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.deps import MAX_UPSTREAMS, Node, check_after, draw, start_state
from dtask.domain.runs import RunState
from dtask.exceptions import InvalidVariables

states = st.sampled_from(list(RunState))


@given(st.dictionaries(st.integers(1, 10_000), states, min_size=1, max_size=20))
def test_a_new_run_fails_waits_or_starts_by_its_upstreams(ups: dict[int, RunState]) -> None:
    state, error = start_state(ups)
    bad = sorted(u for u, s in ups.items() if s in (RunState.FAILED, RunState.CANCELLED))
    if bad:
        how = "was cancelled" if ups[bad[0]] is RunState.CANCELLED else "failed"
        assert (state, error) == (RunState.FAILED, f"upstream run {bad[0]} {how}")
    elif all(s is RunState.SUCCEEDED for s in ups.values()):
        assert (state, error) == (RunState.PENDING, None)
    else:
        assert (state, error) == (RunState.WAITING, None)


def test_upstream_ids_are_positive_integers_each_once_in_order() -> None:
    assert check_after([3, 1, 3, 2], "x") == (3, 1, 2)
    for bad in (0, -1, True, "7", 1.5, None):
        with pytest.raises(InvalidVariables, match="is not a run id"):
            check_after([bad], "run of template 't'")
    with pytest.raises(InvalidVariables, match="over the limit of 10,000"):
        check_after(range(1, MAX_UPSTREAMS + 2), "x")


def test_a_diamond_is_drawn_with_its_shared_upstream_once_in_full() -> None:
    nodes = {i: Node(i, "t", RunState.SUCCEEDED) for i in range(1, 5)}
    lines = draw(4, {4: [2, 3], 2: [1], 3: [1]}, nodes)
    assert lines == [
        "├── run 2 t (succeeded)",
        "│   └── run 1 t (succeeded)",
        "└── run 3 t (succeeded)",
        "    └── run 1 t (succeeded) (see above)",
    ]


@given(st.integers(1, 60), st.integers(1, 30))
def test_a_wide_graph_is_cut_at_the_limit_and_says_so(width: int, limit: int) -> None:
    edges = {0: list(range(1, width + 1))}
    lines = draw(0, edges, {}, limit=limit)
    assert len(lines) == min(width, limit) + (width > limit)
    assert (width > limit) == lines[-1].startswith("... and at least")
