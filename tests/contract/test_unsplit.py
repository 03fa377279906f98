"""Which runs of a ``dtask.masters`` message still have their master to run
(``runs.unsplit``): a message sends back only those. Run on both stores (conftest.py)."""

from __future__ import annotations

from dtask.domain.runs import RunState
from tests.contract.worlds import World


def test_only_runs_not_split_yet_are_left_in_the_order_given(world: World) -> None:
    pending = [world.submit() for _ in range(3)]
    cancelled = world.submit()
    world.runs.cancel(cancelled)
    running = world.run(children=2)
    splitting = world.run(children=2, dispatched=False)  # a master that died mid-split
    assert world.state(splitting) is RunState.SPLITTING
    asked = [pending[2], running, cancelled, pending[0], splitting, 10**12, pending[1]]
    assert world.runs.unsplit(asked) == [pending[2], pending[0], splitting, pending[1]]
    assert world.runs.unsplit([]) == []
