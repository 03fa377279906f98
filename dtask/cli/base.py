"""What every `dtask` command shares: the parser class, exit codes, NAME=VALUE variables."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dtask.exceptions import DtaskError, InvalidSchedule, InvalidVariables

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_YET = 0, 1, 2, 3
TEMPLATES_HELP = (
    "\nevery command also takes --templates MODULES: the modules that define your templates"
    " (DTASK_TEMPLATES for this command; the current folder is importable)\n"
)


def _worth_saying(action: argparse.Action) -> bool:
    """An option's default that its help should show (not off, unset or empty)."""
    default = action.default
    unsaid = default in (None, False, argparse.SUPPRESS) or default == []
    return bool(action.option_strings) and not unsaid


class _WithDefaults(argparse.HelpFormatter):
    """Every option's default in its help, unless the help says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not _worth_saying(action) or "default" in text:
            return text
        return f"{text} (default: {action.default})".strip()


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _WithDefaults)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if not action.help and _worth_saying(action):
            action.help = f"default: {action.default}"  # argparse shows no help-less default
        return action

    def error(self, message: str) -> Any:  # one line, exit 2, like every other bad input
        said = one_line(message)
        self.exit(EXIT_BAD_INPUT, f"dtask: error: {said} (see `{self.prog} --help`)\n")

    def format_help(self) -> str:
        return super().format_help() + TEMPLATES_HELP


def one_line(message: str) -> str:
    """``message`` as one line a terminal shows as it is: what it quotes of the caller's input
    (argparse quotes an unknown argument raw) keeps no newline, carriage return or escape."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def interrupted(exc: BaseException | None) -> bool:
    """Whether ``exc`` is Ctrl-C, or an error raised while Ctrl-C unwound a database call:
    SQLAlchemy's rollback of a statement still in flight fails ("can't commit now: connection
    in transaction status ACTIVE") and hides the KeyboardInterrupt in its context."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class _OldVar(argparse.Action):
    """``-v NAME=VALUE``, the spelling of ``-e``/``--var`` until 0.x: still taken, with a note
    (``-v`` is verbose or version in most commands people know; awk's ``-v`` aside)."""

    said = False

    def __call__(self, parser: Any, namespace: Any, value: Any, option: Any = None) -> None:
        getattr(namespace, self.dest).append(value)
        if not _OldVar.said:
            _OldVar.said = True
            print(
                "dtask: note: -v NAME=VALUE is now -e NAME=VALUE (or --var); -v keeps working"
                " for now and will be removed",
                file=sys.stderr,
            )


def add_vars(parser: argparse.ArgumentParser, help: str) -> None:
    """``-e``/``--var NAME=VALUE`` (repeatable), and the retired ``-v``."""
    parser.add_argument("-e", "--var", action="append", default=[], metavar="NAME=VALUE", help=help)
    parser.add_argument("-v", action=_OldVar, dest="var", help=argparse.SUPPRESS)


def parse_vars(pairs: Sequence[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidVariables(f"-e/--var expects NAME=VALUE, got {pair!r}")
        if name in parsed:
            raise InvalidVariables(f"variable {name!r} is given twice")
        parsed[name] = value
    return parsed


N = TypeVar("N", int, float)


def number(text: str | None, kind: type[N], option: str, error: type[DtaskError]) -> N | None:
    """``text`` given to ``option`` as an int or a float (None stays None), else one line."""
    if text is None:
        return None
    try:
        return kind(text)
    except ValueError:
        what = {int: "a whole number", float: "a number"}[kind]
        if option in ("--execution-cap", "--delay-tolerance"):
            what += " of seconds"
        raise error(f"{option} expects {what}, got {text!r}") from None


def bounded(kind: type[N], low: N, high: N, what: str) -> Callable[[str], N]:
    """An argparse type: ``kind`` from ``low`` to ``high`` (finite), else one line, exit 2."""

    def convert(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what}") from None
        if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            bounds = f"{_shown(low)} to {_shown(high)}"
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not {what} ({bounds})")
        return value

    return convert


def _shown(bound: float) -> str:
    return f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"


BIGINT = 2**63 - 1
port = bounded(int, 1, 65_535, "a TCP port")
run_id = bounded(int, 1, BIGINT, "a run id")
token_id = bounded(int, 1, BIGINT, "a token id")
child_index = bounded(int, 0, 2**31 - 1, "a child's index")
limit = bounded(int, 1, 1_000_000, "a positive whole number")
timeout = bounded(float, 0.0, 366 * 86400.0, "a number of seconds")
processes = bounded(int, 1, 256, "a number of processes")


def moment(text: str | None, tz: str) -> Any:
    """An ISO 8601 time from the command line, in ``tz`` when it names no offset."""
    from datetime import datetime

    from dtask.domain.schedules import zone

    if text is None:
        return None
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidSchedule(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00)") from None
    return found if found.tzinfo else found.replace(tzinfo=zone(tz))
