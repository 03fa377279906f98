"""The one kind of background loop in a worker's main process (the reaper, the dispatcher,
the notifier, the monitor): one pass every interval while there is work, slower otherwise; a
failing pass is logged once per distinct error (with its traceback unless it is a DtaskError)
and tried again. ``in_worker`` starts a list of them in every worker of dtask's app."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery.signals import worker_ready, worker_shutting_down

from dtask.exceptions import DtaskError
from dtask.worker import scope

log = logging.getLogger("dtask.worker")


class Loop:
    """``once`` returns how much work the pass found: none (0, or None where another process
    holds the turn) waits ``slow`` (ten intervals unless given) before the next pass, some
    ``interval``."""

    def __init__(
        self,
        name: str,
        interval: float,
        once: Callable[[], int | None],
        slow: float | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self.slow = 10 * interval if slow is None else slow
        self.once = once
        self.passes = 0  # passes tried
        self.turns = 0  # passes that found the turn free (``once`` did not return None)
        self.busy = 0.0  # seconds spent in those
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dtask {name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.passes:  # what the pass costs (bench.machines reads it)
            log.info(
                "%s loop: %d passes, %d not refused the turn, %.2f ms each, %.2f ms at most",
                self.name, self.passes, self.turns,
                1000 * self.busy / max(self.turns, 1), 1000 * self.longest,
            )  # fmt: skip

    def _loop(self) -> None:
        wait = self.interval
        failing = ""
        while not self._stop.wait(wait):
            began = time.perf_counter()
            try:
                found = self.once()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != failing:
                    log.warning(
                        "%s: pass failed, trying again: %s", self.name, exc,
                        exc_info=not isinstance(exc, DtaskError),
                    )  # fmt: skip
                failing, wait = error, self.slow
                continue
            failing = ""
            self._count(found, time.perf_counter() - began)
            wait = self.interval if found else self.slow

    def _count(self, found: int | None, seconds: float) -> None:
        self.passes += 1
        if found is not None:
            self.turns += 1
            self.busy += seconds
            self.longest = max(self.longest, seconds)


def in_worker(loops: Sequence[Loop]) -> None:
    """Run ``loops`` in the main process of every worker of dtask's app (dtask/worker/scope.py),
    from the moment the worker is ready until it shuts down."""
    started = threading.Event()

    def start(sender: Any = None, **_: Any) -> None:
        if not started.is_set() and scope.serves(getattr(sender, "app", None)):
            started.set()
            for loop in loops:
                loop.start()

    def stop(**_: Any) -> None:
        for loop in loops:
            loop.stop()

    worker_ready.connect(start, weak=False)
    worker_shutting_down.connect(stop, weak=False)
