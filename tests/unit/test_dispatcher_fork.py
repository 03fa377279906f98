"""The dispatcher's per-process state across a fork: a pool process forked while the main
process's dispatcher thread was in a pass must not inherit that pass's lock or connection
(a master's nudge in it would wait for ever)."""

from __future__ import annotations

import os
import signal

import pytest

from dtask.worker.dispatcher import Dispatcher, Forks
from dtask.worker.reaper import Sender


def test_a_child_forked_during_a_pass_runs_its_own_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dispatcher = Dispatcher()
    monkeypatch.setattr(Dispatcher, "_pass", lambda self, sender, wait=0.0: 7)
    parent_sender = dispatcher.sender = Sender()
    dispatcher.lock.acquire()  # the parent's dispatcher thread is in a pass
    try:
        pid = os.fork()
        if pid == 0:  # the child: a pool process whose master nudges the dispatcher
            signal.alarm(5)
            ok = dispatcher.once() == 7 and dispatcher.sender is not parent_sender
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        dispatcher.lock.release()
    assert os.waitstatus_to_exitcode(status) == 0, "the child's pass hung or reused the socket"


def test_the_parent_opens_a_new_connection_after_it_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dispatcher = Dispatcher()
    monkeypatch.setattr(Dispatcher, "_pass", lambda self, sender, wait=0.0: 1)
    dispatcher.once()
    first = dispatcher.sender
    dispatcher.once()
    assert dispatcher.sender is first  # kept across passes
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert Forks.count >= 1
    dispatcher.once()
    assert dispatcher.sender is not first  # the child may have shut the old socket down
