from __future__ import annotations

import logging

import pytest

from dtask.exceptions import DatabaseUnavailable
from dtask.worker.reaper import Failures


def _raise(exc: Exception) -> None:
    raise exc


def test_a_failing_run_is_logged_once_until_its_error_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures = Failures()
    caplog.set_level(logging.ERROR, logger="dtask.reaper")
    for _ in range(3):
        assert failures.guard("restart", 7, lambda: _raise(KeyError("x"))) is None
    assert failures.guard("restart", 8, lambda: 42) == 42
    failures.guard("restart", 7, lambda: _raise(DatabaseUnavailable("db gone")))
    failures.guard("restart", 7, lambda: "ok")
    failures.guard("restart", 7, lambda: _raise(DatabaseUnavailable("db gone")))
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "reaper: restart of run 7 failed: KeyError: 'x'",
        "reaper: restart of run 7 failed: db gone",
        "reaper: restart of run 7 failed: db gone",
    ]
    assert caplog.records[0].exc_info and not caplog.records[1].exc_info
