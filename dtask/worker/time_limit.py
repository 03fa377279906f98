"""A bound on user code that runs inside a transaction (a template's split): SIGALRM in the
process's main thread, where Celery's prefork and solo pools run tasks. Elsewhere (the threads
pool), or when another timer is armed, PostgreSQL's idle-in-transaction timeout is the bound."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from dtask.exceptions import SplitFailed


class _Expired(BaseException):
    """Raised by the alarm: a BaseException, so user code's ``except Exception`` cannot
    swallow it; turned into SplitFailed at the boundary."""


@contextmanager
def time_limit(seconds: float, what: str) -> Iterator[None]:
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise _Expired

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        raise SplitFailed(
            f"{what} did not finish within {seconds:g} s (DTASK_SPLIT_TIMEOUT)"
        ) from None
    finally:
        signal.signal(signal.SIGALRM, previous)
