"""``plan`` picks each child through heaps (O(log runs) a child); the rule it keeps is the
plain one, a min() over every waiting run per child: same counts and same passes, over many
plans sharing their fair-share state."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.dispatch import Demand, Passes, Share, plan

T0 = datetime(2026, 11, 23, tzinfo=UTC)


def reference(
    demands: Iterable[Demand], shares: dict[str, Share], free: int, passes: Passes
) -> dict[int, int]:
    waiting = [d for d in demands if d.unsent > 0]
    if free <= 0 or not waiting:
        return {}
    enter(passes.clients, {d.client for d in waiting})
    for client in {d.client for d in waiting}:
        enter(passes.runs, {d.run_id for d in waiting if d.client == client})
    left = {d.run_id: d.unsent for d in waiting}
    room = {d.client: shares.get(d.client, Share()).room for d in waiting}
    sent: dict[int, int] = {}
    while free > 0:
        ready = [d for d in waiting if left[d.run_id] > 0 and room[d.client] > 0]
        if not ready:
            break
        d = min(
            ready,
            key=lambda d: (
                -d.priority,
                d.deadline.timestamp() if d.deadline is not None else math.inf,
                passes.clients[d.client],
                passes.runs[d.run_id],
                d.run_id,
            ),
        )
        sent[d.run_id] = sent.get(d.run_id, 0) + 1
        left[d.run_id] -= 1
        room[d.client] -= 1
        free -= 1
        passes.clients[d.client] += 1 / shares.get(d.client, Share()).weight
        passes.runs[d.run_id] += 1
    return sent


def enter(passes: dict[str, float] | dict[int, float], present: set[object]) -> None:
    start = min((p for k, p in passes.items() if k in present), default=0.0)
    for key in present:
        passes.setdefault(key, start)  # type: ignore[arg-type]


demands = st.lists(
    st.builds(
        Demand,
        run_id=st.integers(1, 60),
        client=st.sampled_from(["a", "b", "c", "d"]),
        priority=st.integers(0, 3),
        deadline=st.one_of(st.none(), st.integers(0, 3).map(lambda s: T0 + timedelta(s))),
        unsent=st.integers(0, 30),
    ),
    max_size=25,
    unique_by=lambda d: d.run_id,
)
shares = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.builds(
        Share,
        weight=st.floats(0.1, 10),
        max_running=st.one_of(st.none(), st.integers(1, 40)),
        in_flight=st.integers(0, 25),
    ),
)


@given(st.lists(st.tuples(demands, shares, st.integers(0, 150)), min_size=1, max_size=6))
def test_plan_sends_what_the_plain_rule_sends(
    rounds: list[tuple[list[Demand], dict[str, Share], int]],
) -> None:
    mine, theirs = Passes(), Passes()
    for runs, share, free in rounds:
        assert plan(runs, share, free, mine) == reference(runs, share, free, theirs)
        assert mine == theirs
        kept = {d.run_id for d in runs}
        mine.forget_except({d.client for d in runs}, kept)
        theirs.forget_except({d.client for d in runs}, kept)
