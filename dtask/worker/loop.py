"""A background loop in a worker's main process: one pass every interval while there is work,
ten intervals otherwise; a failing pass is logged once per distinct error and retried."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery.signals import worker_ready, worker_shutting_down

from dtask.worker import scope

log = logging.getLogger("dtask.worker")


class Loop:
    def __init__(self, name: str, interval: float, once: Callable[[], int | None]) -> None:
        self.name = name
        self.interval = interval
        self.once = once
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dtask {name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        wait = self.interval
        failing = ""
        while not self._stop.wait(wait):
            try:
                busy = self.once()
            except Exception as exc:
                if str(exc) != failing:
                    log.warning("%s: pass failed, trying again: %s", self.name, exc)
                failing, wait = str(exc), 10 * self.interval
                continue
            failing = ""
            wait = self.interval if busy else 10 * self.interval


def in_worker(name: str, interval: float, once: Callable[[], int | None]) -> None:
    """Run ``once`` in a :class:`Loop` in the main process of every worker of dtask's app
    (dtask/worker/scope.py), from the moment the worker is ready until it shuts down."""
    loop = Loop(name, interval, once)
    started = threading.Event()

    def start(sender: Any = None, **_: Any) -> None:
        if not started.is_set() and scope.serves(getattr(sender, "app", None)):
            started.set()
            loop.start()

    def stop(**_: Any) -> None:
        loop.stop()

    worker_ready.connect(start, weak=False)
    worker_shutting_down.connect(stop, weak=False)
