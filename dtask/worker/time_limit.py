"""A bound on user code that runs inside a transaction (a template's split): SIGALRM in the
process's main thread, where Celery's prefork and solo pools run tasks. Elsewhere (the
threads pool) PostgreSQL's idle-in-transaction timeout is the bound."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from dtask.exceptions import SplitFailed


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise SplitFailed(f"{what} did not finish within {seconds:g} s (DTASK_SPLIT_TIMEOUT)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
