"""The split's time limit: SIGALRM in the main thread; user code cannot swallow it, the
previous handler is back afterwards, and someone else's armed timer is left alone."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from dtask.exceptions import SplitFailed
from dtask.worker.time_limit import time_limit

# pytest-timeout arms SIGALRM itself by default: its thread method leaves the timer to us
pytestmark = pytest.mark.timeout(120, method="thread")


def test_a_split_that_swallows_exceptions_still_stops_and_the_handler_is_restored() -> None:
    before = signal.getsignal(signal.SIGALRM)
    with (
        pytest.raises(SplitFailed, match=r"the split did not finish within 0.2 s"),
        time_limit(0.2, "the split"),
    ):
        try:
            time.sleep(5)
        except Exception:  # what careless user code does
            time.sleep(5)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_fast_code_is_untouched() -> None:
    with time_limit(5, "the split"):
        pass
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_another_timer_or_another_thread_means_no_alarm_of_ours() -> None:
    def elsewhere() -> None:
        with time_limit(0.1, "the split"):
            time.sleep(0.3)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with time_limit(0.05, "the split"):
            time.sleep(0.1)  # our limit would have fired here
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # theirs still armed
        time.sleep(0.4)
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
