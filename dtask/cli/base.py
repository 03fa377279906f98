"""What every `dtask` command shares: the parser class, exit codes, NAME=VALUE variables."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dtask.exceptions import InvalidVariables

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, like every other bad input
        self.exit(EXIT_BAD_INPUT, f"dtask: error: {message} (see `{self.prog} --help`)\n")


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
