"""Heartbeat: a lease that cannot be renewed runs out on this process's clock, even while a
renewal hangs on a dead link; the child is then told to stop, and nothing waits on the hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dtask.domain.runs import RunState
from dtask.exceptions import DatabaseUnavailable
from dtask.worker.heartbeat import Heartbeat


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def test_a_lease_whose_renewal_hangs_is_lost_after_the_lease_and_leaving_does_not_wait() -> None:
    release = threading.Event()

    def hangs() -> RunState:
        release.wait(10)  # a statement on a link that drops packets
        return RunState.RUNNING

    beat = Heartbeat(hangs, interval=0.05, name="1.0", lease=0.3)
    try:
        with beat:
            assert not beat.lease_lost()
            assert wait_until(beat.lease_lost, timeout=3)
            assert beat.expired() and not beat.lost.is_set()
            left_at = time.monotonic()
        assert time.monotonic() - left_at < 1.0, "leaving waited on the hung renewal"
    finally:
        release.set()


def test_failed_renewals_expire_the_lease_and_name_their_cause() -> None:
    def unreachable() -> RunState:
        raise DatabaseUnavailable("cannot reach PostgreSQL at somewhere")

    with Heartbeat(unreachable, interval=0.05, name="1.1", lease=0.3) as beat:
        assert wait_until(beat.lease_lost, timeout=3)
    assert beat.last_error == "cannot reach PostgreSQL at somewhere"


def test_renewals_and_renewing_writes_keep_the_lease() -> None:
    with Heartbeat(lambda: RunState.RUNNING, interval=0.05, name="1.2", lease=0.3) as beat:
        time.sleep(0.6)
        assert not beat.lease_lost()
    silent = Heartbeat(lambda: RunState.RUNNING, interval=60, name="1.3", lease=0.3)
    time.sleep(0.2)
    silent.renewed(time.monotonic())  # a checkpoint that succeeded renews the lease too
    time.sleep(0.2)
    assert not silent.lease_lost()
    time.sleep(0.2)
    assert silent.lease_lost()
