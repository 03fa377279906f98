"""Every round trip to PostgreSQL bounded on this process's own clock.

``tcp_user_timeout`` and TCP keepalives (``Limits.connect_args``) drop a connection whose
packets go unacknowledged. They see nothing where the peer's kernel still acknowledges every
byte and nothing answers: a relay, proxy or pooler that hangs, a frozen server, a middlebox
that terminates TCP and drops what it should forward. A statement sent there waits for ever,
and since a process holds one or two connections (DESIGN invariant 16), so does every other
caller in that process: a worker cut off that way said nothing at all.

So each round trip of a connection made here is watched. One that has had no answer for half
the network timeout makes the process's watchdog try a new connection to the same server,
bounded by the other half (``connect_timeout``, 2 s at least). If that gets no answer either,
the link is gone: each round trip still waiting since before the try ends at once (its socket
is shut down, never closed under its owner) and raises as a lost connection, which SQLAlchemy
takes as a disconnect (the pool's other connections of before are dropped too). A slow
statement on a link that answers is left alone (the server's ``statement_timeout`` bounds
it): the new connection succeeds, or the server refuses it in words (too many clients), and
it is tried again a network timeout later if the statement still waits.

At the default network timeout (8 s) a round trip into a blackhole ends 6 to 10 s after it
was sent. No round trip is added on any path; a watched one costs two set operations under a
lock (0.7 us). One thread per process, started with its first watched round trip, looks
every quarter of the network timeout, at most a second apart.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import make_conninfo

if TYPE_CHECKING:
    from psycopg.abc import PQGen

log = logging.getLogger(__name__)

RV = TypeVar("RV")

# psycopg's own keywords of connect(); every other keyword is a libpq parameter
_NOT_LIBPQ = frozenset(
    {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}
)


@dataclass(frozen=True)
class Target:
    """Where a connection goes, as a new connection would go there to see if it answers."""

    conninfo: str  # with the try's connect_timeout and application_name; holds the password
    where: str  # the URL without its password, for the log
    bound: float  # the network timeout

    @property
    def trial(self) -> float:
        """How long the new connection is given: the other half of the bound."""
        return float(max(2, math.ceil(self.bound / 2)))


def connect(where: str, bound: float, *args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect(*args, **kwargs)``, its round trips then bounded by ``bound`` s."""
    conn = Watched.connect(*args, **kwargs)
    libpq = {name: value for name, value in kwargs.items() if name not in _NOT_LIBPQ}
    libpq["connect_timeout"] = max(2, math.ceil(bound / 2))
    libpq["application_name"] = f"dtask:{os.getpid()}:probe"
    conninfo = make_conninfo(args[0] if args else "", **libpq)
    conn.dtask_target = Target(conninfo, where, bound)
    _watchdog().every(bound / 4)
    return conn


class Watched(psycopg.Connection[Any]):
    """A connection whose round trips the process's watchdog bounds (``connect``)."""

    dtask_target: Target | None = None

    def wait(self, gen: PQGen[RV], *args: Any, **kwargs: Any) -> RV:
        target = self.dtask_target
        if target is None or args or kwargs.get("timeout") is not None:
            return super().wait(gen, *args, **kwargs)  # its caller bounds it
        try:
            fd = self.pgconn.socket
        except psycopg.Error:
            return super().wait(gen, *args, **kwargs)  # lost already: psycopg says so
        watchdog = _watchdog()
        waiting = watchdog.start(target, fd)
        try:
            return super().wait(gen, *args, **kwargs)
        except psycopg.OperationalError as exc:
            if waiting.dropped_after is None:
                raise
            raise psycopg.OperationalError(
                f"no answer for {waiting.dropped_after:.1f} s, nor to a new connection within"
                f" {target.trial:g} s: the connection was dropped"
            ) from exc
        finally:
            watchdog.end(waiting)


@dataclass(eq=False)
class _Waiting:
    target: Target
    fd: int
    since: float = field(default_factory=time.monotonic)
    dropped_after: float | None = None


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[_Waiting] = set()
        self._tick = 1.0  # how often it looks: at most a second, a quarter of a bound
        self._thread: threading.Thread | None = None
        self._next_try: dict[Target, float] = {}

    def every(self, seconds: float) -> None:
        self._tick = min(self._tick, max(0.1, seconds))

    def start(self, target: Target, fd: int) -> _Waiting:
        waiting = _Waiting(target, fd)
        with self._lock:
            self._waiting.add(waiting)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dtask-db-watchdog", daemon=True
                )
                self._thread.start()
        return waiting

    def end(self, waiting: _Waiting) -> None:
        with self._lock:
            self._waiting.discard(waiting)

    def _run(self) -> None:
        while True:
            time.sleep(self._tick)
            try:
                self._look()
            except Exception:  # the watchdog must outlive anything it meets
                log.exception("dtask: the PostgreSQL watchdog's look failed")

    def _look(self) -> None:
        now = time.monotonic()
        with self._lock:
            overdue = {w.target for w in self._waiting if now - w.since >= w.target.bound / 2}
        for target in overdue:
            if now < self._next_try.get(target, 0.0):
                continue
            tried_at = time.monotonic()
            if _answers(target):
                self._next_try[target] = tried_at + target.bound
            else:
                self._drop(target, tried_at)

    def _drop(self, target: Target, before: float) -> None:
        """End every round trip to ``target`` waiting since before ``before``: the fd is still
        its connection's while it is in ``_waiting`` (removed under the lock, then closed)."""
        now = time.monotonic()
        dropped = []
        with self._lock:
            for waiting in self._waiting:
                if (
                    waiting.target == target
                    and waiting.since <= before
                    and waiting.dropped_after is None
                ):
                    waiting.dropped_after = now - waiting.since
                    _shut(waiting.fd)
                    dropped.append(waiting.dropped_after)
        if dropped:
            log.warning(
                "dtask: cannot reach PostgreSQL at %s: no answer for %.1f s, nor to a new"
                " connection within %g s; dropping %d connection(s) waiting on it",
                target.where, max(dropped), target.trial, len(dropped),
            )  # fmt: skip


def _answers(target: Target) -> bool:
    """Whether a new connection to ``target`` gets an answer: connected, or refused by the
    server in words; False when the try got none in its time (in a thread of its own, so that
    nothing it does, a name lookup included, can hold the watchdog)."""
    answered: list[bool] = []

    def attempt() -> None:
        try:
            psycopg.connect(target.conninfo, autocommit=True).close()
        except psycopg.OperationalError as exc:  # refused, reset, or the server's words
            answered.append("timeout expired" not in str(exc))
        except Exception:  # a try that cannot be made says nothing of the link
            answered.append(True)
        else:
            answered.append(True)

    trying = threading.Thread(target=attempt, name="dtask-db-probe", daemon=True)
    trying.start()
    # psycopg bounds each host's try by connect_timeout; a multi-host URL tries each in turn
    trying.join(target.trial * 4 + 1)
    return bool(answered) and answered[0]


def _shut(fd: int) -> None:
    """Shut the socket down under its owner: its waits end with EOF at once, and the fd stays
    the owner's to close (a dup is shut down, then closed)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


_current = _Watchdog()


def _watchdog() -> _Watchdog:
    return _current


def _forget_after_fork() -> None:
    # the parent's thread and round trips are not this process's
    global _current
    _current = _Watchdog()


os.register_at_fork(after_in_child=_forget_after_fork)
