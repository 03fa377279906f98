"""A split by live capacity (``RangeSplit(parts="slots")``) reads the live slots of the run's
queue and tier, of the workers that can run its template, on the split's own transaction,
and the run keeps what it saw (``dtask status``). Run on both stores (conftest.py)."""

from __future__ import annotations

import uuid

from dtask.db.workers import LiveSlots
from dtask.domain.clients import Tier
from dtask.domain.runs import RunState
from tests.contract.dispatching import Dispatching
from tests.contract.worlds import World


def split_seeing(world: World, queue: str, **options: object) -> tuple[int, int]:
    """A run of template ``t`` in ``queue`` split by what its slots say: (run, slots seen)."""
    run_id = world.submit("t", queue=queue, **options)
    seen: list[int] = []

    def plan(run: object, slots: LiveSlots) -> list[dict[str, int]]:
        seen.append(slots(30.0))
        assert slots(30.0) == seen[0]  # read once
        return [{"i": i} for i in range(max(1, seen[0]))]

    assert world.runs.split(run_id, plan) is RunState.SPLITTING
    return run_id, seen[0]


def test_the_slots_are_those_of_live_workers_of_its_queue_that_know_its_template(
    world: World, dispatching: Dispatching
) -> None:
    q = f"q{uuid.uuid4().hex[:8]}"
    dispatching.worker(q, slots=2)  # did not say what it knows: counted
    dispatching.worker(q, "other", slots=3, templates=["t", "u"])
    dispatching.worker(q, slots=4, templates=["u"])  # cannot run t
    dispatching.worker(f"{q}x", slots=5)  # another queue
    dispatching.worker(f"{q}.premium", f"{q}.regular", q, slots=1)  # a premium worker
    run_id, seen = split_seeing(world, q)
    assert seen == 6
    status = world.runs.status(run_id)
    assert (status.slots, status.children.total) == (6, 6)
    assert status.as_json()["slots"] == 6


def test_a_tiers_run_sees_only_the_workers_of_its_tier_or_above(
    world: World, dispatching: Dispatching
) -> None:
    q = f"q{uuid.uuid4().hex[:8]}"
    dispatching.worker(q, slots=2)
    dispatching.worker(f"{q}.regular", q, slots=3)
    dispatching.worker(f"{q}.premium", f"{q}.regular", q, slots=1)
    assert split_seeing(world, q, tier=Tier.REGULAR)[1] == 4
    assert split_seeing(world, q, tier=Tier.PREMIUM)[1] == 1


def test_no_live_worker_is_zero_slots_and_a_fixed_split_records_none(world: World) -> None:
    run_id, seen = split_seeing(world, f"q{uuid.uuid4().hex[:8]}")
    assert (seen, world.runs.status(run_id).slots) == (0, 0)
    fixed = world.submit("t")
    assert world.runs.split(fixed, lambda run, slots: [{"i": 0}]) is RunState.SPLITTING
    assert world.runs.status(fixed).slots is None
