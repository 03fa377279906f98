"""Lease heartbeats from a thread, so the user's loop never has to renew anything."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from dtask.exceptions import DtaskError

log = logging.getLogger("dtask.worker")


class Heartbeat:
    """Renews a child's lease every ``interval`` seconds while the block runs.

    ``lost`` is set when a renewal is refused (the fence moved: another worker took the child
    over); the child's context then stops it at its next step. A database that cannot be
    reached is retried at the next beat: if it stays away past the lease, fencing still holds.
    """

    def __init__(self, renew: Callable[[], bool], interval: float, name: str) -> None:
        self._renew = renew
        self._interval = interval
        self._stop = threading.Event()
        self.lost = threading.Event()
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
                if not self._renew():
                    self.lost.set()
                    return
            except DtaskError as exc:
                log.warning("heartbeat failed, retrying: %s", exc)
