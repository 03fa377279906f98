"""Lease heartbeats from a thread, so the user's loop never has to renew anything."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from dtask.exceptions import DtaskError
from dtask.runs import RunState

log = logging.getLogger("dtask.worker")


class Heartbeat:
    """Renews a child's lease every ``interval`` seconds while the block runs.

    ``renew`` returns the run's state, or None when the renewal is refused (the fence moved:
    another worker took the child over); then ``lost`` is set and the child's context stops it
    at its next step. ``stop_requested`` is set when the run is no longer running (cancelled).
    A database that cannot be reached is retried at the next beat: if it stays away past the
    lease, fencing still holds.
    """

    def __init__(self, renew: Callable[[], RunState | None], interval: float, name: str) -> None:
        self._renew = renew
        self._interval = interval
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.stop_requested = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {name}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                state = self._renew()
            except DtaskError as exc:
                log.warning("heartbeat failed, retrying: %s", exc)
                continue
            if state is None:
                self.lost.set()
                return
            if state is not RunState.RUNNING and state is not RunState.SPLITTING:
                self.stop_requested.set()
