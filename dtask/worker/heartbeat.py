"""Lease heartbeats from a thread, so the user's loop never has to renew anything."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType

from dtask.domain.runs import RunState
from dtask.exceptions import DtaskError

log = logging.getLogger("dtask.worker")


class Flag:
    """Set once by one thread, read by another; nothing ever waits on it. A threading.Event
    (a lock and a condition) costs more to make than a short child's whole run."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class Heartbeat:
    """Renews a child's lease every ``interval`` seconds while the block runs.

    ``renew`` returns the run's state, or None when the renewal is refused (the fence moved:
    another worker took the child over); then ``lost`` is set and the child's context stops it
    at its next step. ``stop_requested`` is set when the run is no longer running (cancelled).
    A database that cannot be reached is retried at the next beat; once ``lease`` seconds have
    passed since the last renewal known to have succeeded was sent, the lease is ``expired``:
    another worker may own the child, and ``lease_lost`` tells the child to stop. That is
    judged by this process's clock, not by a renewal that may hang on a dead link.

    ``give_up`` runs on the heartbeat thread at the monotonic time ``give_up_at`` if the block
    is still running (a child that ignored a request to stop, e.g. over its execution cap);
    it normally ends the process (``runaway.kill_this_pool_process``). No renewal follows it.

    One thread per process does the beating: starting and joining a thread per child costs
    more than a short child itself.
    """

    def __init__(
        self,
        renew: Callable[[], RunState | None],
        interval: float,
        name: str,
        *,
        give_up_at: float = math.inf,
        give_up: Callable[[], None] | None = None,
        lease: float = math.inf,
        since: float | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self._renew = renew
        self.interval = interval
        self.name = name
        self.give_up_at = give_up_at if give_up is not None else math.inf
        self._give_up = give_up
        self.lost = Flag()
        self.stop_requested = Flag()
        self.lease = lease
        self.renewed_at = time.monotonic() if since is None else since
        self.last_error: str | None = None
        self._on_stop = on_stop

    def end_by(self, at: float, give_up: Callable[[], None]) -> None:
        """Run ``give_up`` at ``at`` (monotonic) instead, if that is sooner and the block still
        runs (a cancel that terminates)."""
        if at < self.give_up_at:
            self.give_up_at, self._give_up = at, give_up

    def renewed(self, sent_at: float) -> None:
        """A write that renews the lease (a checkpoint), sent at ``sent_at``, succeeded."""
        self.renewed_at = max(self.renewed_at, sent_at)

    def unrenewed_for(self) -> float:
        return time.monotonic() - self.renewed_at

    def expired(self) -> bool:
        return self.unrenewed_for() > self.lease

    def lease_lost(self) -> bool:
        """Stop the child: taken over, or its lease ran out with no renewal we know of."""
        return self.lost.is_set() or self.expired()

    def next_due(self) -> float:
        return min(time.monotonic() + self.interval, self.give_up_at)

    def __enter__(self) -> Heartbeat:
        _beater().add(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _beater().remove(self)

    def beat(self) -> bool:
        """Renew once; False when there is nothing more to renew (the child was lost)."""
        if self._give_up is not None and time.monotonic() >= self.give_up_at:
            self._give_up()
            return False
        sent_at = time.monotonic()
        try:
            state = self._renew()
        except DtaskError as exc:
            self.last_error = str(exc)
            log.warning("heartbeat of %s failed, retrying: %s", self.name, exc)
            return True
        if state is None:
            self.lost.set()
            return False
        self.renewed(sent_at)
        if state is not RunState.RUNNING and state is not RunState.SPLITTING:
            if not self.stop_requested.is_set() and self._on_stop is not None:
                self._on_stop()  # once, on this thread
            self.stop_requested.set()
        return True


class _Beater:
    """The process's heartbeat thread: renews each registered Heartbeat when it is due."""

    def __init__(self) -> None:
        self._due: dict[Heartbeat, float] = {}
        self._beating: Heartbeat | None = None
        self._wake_at = math.inf
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="dtask-heartbeat", daemon=True)
        self._thread.start()

    def add(self, beat: Heartbeat) -> None:
        with self._changed:
            due = self._due[beat] = beat.next_due()
            if due < self._wake_at:  # else the thread wakes in time anyway: no switch per child
                self._changed.notify()

    def remove(self, beat: Heartbeat) -> None:
        """Stop renewing ``beat``; returns once no renewal of it is in flight, unless its lease
        is lost (a renewal hung on a dead link must not hold the process back from new work)."""
        with self._changed:
            self._due.pop(beat, None)
            while self._beating is beat and not beat.lease_lost():
                self._changed.wait(beat.interval)

    def _loop(self) -> None:
        while True:
            beat = self._next_due()
            try:
                keep = beat.beat()
            except Exception:  # never let one child's surprise stop every child's heartbeat
                log.exception("heartbeat of %s failed", beat.name)
                keep = True
            with self._changed:
                self._beating = None
                if beat in self._due:
                    if keep:
                        self._due[beat] = beat.next_due()
                    else:
                        del self._due[beat]
                self._changed.notify_all()

    def _next_due(self) -> Heartbeat:
        with self._changed:
            while True:
                if not self._due:
                    self._wake_at = math.inf
                    self._changed.wait()
                    continue
                beat, due = min(self._due.items(), key=lambda item: item[1])
                wait = due - time.monotonic()
                if wait <= 0:
                    self._beating = beat
                    return beat
                self._wake_at = due
                self._changed.wait(wait)


_the_beater: _Beater | None = None
_lock = threading.Lock()


def _beater() -> _Beater:
    # Per process: a forked pool process does not inherit the parent's thread, and forgets
    # the parent's beater (below). Asked twice for each child: no lock once it exists.
    global _the_beater
    beater = _the_beater
    if beater is not None:
        return beater
    with _lock:
        if _the_beater is None:
            _the_beater = _Beater()
        return _the_beater


def _reset_after_fork() -> None:
    global _lock, _the_beater
    _lock = threading.Lock()
    _the_beater = None


os.register_at_fork(after_in_child=_reset_after_fork)
