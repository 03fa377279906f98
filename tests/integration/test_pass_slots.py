"""The cluster's pass slots (``LeaseStore.due``): whoever asks, at most one pass of a loop per
slot in the whole cluster, the next one free once the slot ends, and a pass that found
nothing puts the next slot further away."""

from __future__ import annotations

import threading
import time
import uuid

from dtask import services


def test_one_caller_of_many_gets_each_slot_and_the_next_once_it_ends(
    dtask_env: dict[str, str],
) -> None:
    leases = services.store().leases
    name = f"pass:test-{uuid.uuid4().hex[:8]}"
    won: list[bool] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        won.append(leases.due(name, 30))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == [False] * 7 + [True]
    assert not leases.due(name, 0.3)
    leases.next_due_in(name, 0.3)
    assert not leases.due(name, 0.3)
    deadline = time.monotonic() + 30
    while not leases.due(name, 0.3):  # free once the 0.3 s are over, however busy the box
        assert time.monotonic() < deadline
        time.sleep(0.05)
