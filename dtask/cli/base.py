"""What every `dtask` command shares: the parser class, exit codes, NAME=VALUE variables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, TypeVar

from dtask.exceptions import DtaskError, InvalidVariables

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_YET = 0, 1, 2, 3
TEMPLATES_HELP = (
    "\nevery command also takes --templates MODULES: the modules that define your templates"
    " (DTASK_TEMPLATES for this command; the current folder is importable)\n"
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, like every other bad input
        self.exit(EXIT_BAD_INPUT, f"dtask: error: {message} (see `{self.prog} --help`)\n")

    def format_help(self) -> str:
        return super().format_help() + TEMPLATES_HELP


def parse_vars(pairs: Sequence[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidVariables(f"-v expects NAME=VALUE, got {pair!r}")
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
