"""Every contract test runs twice: against the in-memory store (tests/support/memory.py) and
against the real store on the session's PostgreSQL. A test that passes on one and fails on
the other is the fake drifting from the truth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dtask import services
from tests.contract import worlds
from tests.contract.dispatching import Dispatching


@pytest.fixture(params=["memory", "postgresql"])
def world(request: pytest.FixtureRequest) -> worlds.World:
    if request.param == "memory":
        return worlds.memory()
    request.getfixturevalue("dtask_env")
    return worlds.postgresql(services.store())


@pytest.fixture
def dispatching(world: worlds.World) -> Iterator[Dispatching]:
    made = Dispatching(world)
    yield made
    for name in made.reported:  # a later test's queues are its own, but its slots too
        world.workers.leave(name)
