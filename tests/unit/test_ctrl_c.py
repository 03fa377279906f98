"""Ctrl-C while `dtask submit --wait` polls PostgreSQL: the KeyboardInterrupt can land inside
a statement, and SQLAlchemy's rollback of it then fails with an error of its own ("can't
commit now: connection in transaction status ACTIVE") that hides the interrupt. The command
still says how to follow or cancel the run and exits 130, never with a traceback (the
acceptance test of the same, tests/acceptance/test_first_hour.py, met it once under load)."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import InternalError

from dtask import cli
from dtask.cli import base
from dtask.cli import runs as run_commands
from dtask.client.runs import Run
from dtask.exceptions import DatabaseUnavailable


def database_error(wrap: type[Exception]) -> Exception:
    if wrap is InternalError:
        return InternalError("COMMIT", {}, Exception("connection in transaction status ACTIVE"))
    return wrap("PostgreSQL is unreachable")


def hidden_ctrl_c(wrap: type[Exception]) -> Exception:
    """What a Ctrl-C during a statement surfaces as: an error whose context is the interrupt."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        try:
            raise database_error(wrap)
        except Exception as exc:
            return exc
    raise AssertionError("unreachable")


@pytest.mark.parametrize("wrap", [InternalError, DatabaseUnavailable])
def test_an_interrupt_hidden_in_a_database_error_is_still_ctrl_c(wrap: type[Exception]) -> None:
    assert base.interrupted(hidden_ctrl_c(wrap))
    assert base.interrupted(KeyboardInterrupt())
    assert not base.interrupted(database_error(wrap))


@pytest.mark.parametrize("wrap", [InternalError, DatabaseUnavailable])
def test_waiting_says_how_to_follow_the_run_and_exits_130(
    wrap: type[Exception], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wait(self: Run, *args: object, **kwargs: object) -> None:
        raise hidden_ctrl_c(wrap)

    monkeypatch.setattr(Run, "wait", wait)
    with pytest.raises(SystemExit) as exited:
        run_commands._wait(7, None, show=False)
    assert exited.value.code == 130
    assert "run 7 goes on: `dtask status 7 --watch`" in capsys.readouterr().err


def test_any_command_interrupted_in_a_database_call_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def runs(args: object) -> int:
        raise hidden_ctrl_c(InternalError)

    monkeypatch.setattr(run_commands, "_cmd_runs", runs)
    assert cli.main(["runs"]) == 130
    assert capsys.readouterr().err == "dtask: interrupted\n"
