"""A loop's broker connection across a fork (dtask/worker/messages.py's ``Sender``): a pool
process forked while the main process's dispatcher was in a pass must not inherit that pass's
lock or socket (a master's nudge in it would wait for ever), and the parent opens a new
connection after any fork (the child's after-fork cleanup may have shut the old one down)."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from dtask.worker import messages
from dtask.worker.dispatcher import Dispatcher


class Connection:
    released = 0

    def release(self) -> None:
        Connection.released += 1


class App:
    """What a Sender uses of the Celery app: a connection and a producer on it."""

    def __init__(self) -> None:
        self.amqp = self

    def connection_for_write(self) -> Connection:
        return Connection()

    def Producer(self, connection: Connection) -> tuple[str, Connection]:
        return ("producer", connection)


@pytest.fixture(autouse=True)
def app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "current", App)
    monkeypatch.setattr(Dispatcher, "_pass", lambda self, sender, wait=0.0: sender.producer)


def fork(child: Any) -> int:
    pid = os.fork()
    if pid == 0:
        signal.alarm(5)
        os._exit(child())
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_child_forked_during_a_pass_runs_its_own_passes() -> None:
    dispatcher = Dispatcher()
    parents = dispatcher.once()
    dispatcher.lock.acquire()  # the parent's dispatcher thread is in a pass
    try:
        released = Connection.released

        def child() -> int:  # a pool process whose master nudges the dispatcher
            ok = dispatcher.once() is not parents and Connection.released == released
            return 0 if ok else 1

        code = fork(child)
    finally:
        dispatcher.lock.release()
    assert code == 0, "the child's pass hung, reused the parent's socket or released it"


def test_the_parent_opens_a_new_connection_after_it_forked() -> None:
    dispatcher = Dispatcher()
    first = dispatcher.once()
    assert dispatcher.once() is first  # kept across passes
    released = Connection.released
    assert fork(lambda: 0) == 0
    assert dispatcher.once() is not first  # the child may have shut the old socket down
    assert Connection.released == released + 1


def test_a_failed_pass_drops_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    dispatcher = Dispatcher()
    first = dispatcher.once()

    def failing(self: Dispatcher, sender: messages.Sender, wait: float = 0.0) -> Any:
        assert sender.producer is not None
        raise ConnectionResetError("connection reset by peer")

    monkeypatch.setattr(Dispatcher, "_pass", failing)
    with pytest.raises(ConnectionResetError):
        dispatcher.once()
    monkeypatch.setattr(Dispatcher, "_pass", lambda self, sender, wait=0.0: sender.producer)
    assert dispatcher.once() is not first
