"""Command templates' pure part: a child's argv from its spec (placeholders become whole
arguments, never shell text), and the lines a command prints to talk to dtask. The process
itself is run by dtask/templating/commands.py."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dtask.domain.placeholders import PLACEHOLDER, placeholders
from dtask.exceptions import CommandFailed, TemplateDefinitionError

CHECKPOINT, RESULT = "::checkpoint ", "::result "
GRACE = 10.0  # seconds from SIGTERM to SIGKILL when a command is asked to stop


@dataclass(frozen=True)
class Command:
    """What a command template's child runs: ``argv`` with ``${key}`` placeholders naming the
    child's spec keys; run without a shell unless ``shell`` (then ``argv`` is one line of
    shell whose placeholders are quoted); ``env`` added to the worker's environment; ``cwd``
    its working directory (None: the worker's)."""

    argv: tuple[str, ...]
    shell: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    grace: float = GRACE
    stealable: bool = False  # it reads its range's end back after each checkpoint

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise TemplateDefinitionError("command must be a non-empty list of strings")
        if self.shell and len(self.argv) != 1:
            raise TemplateDefinitionError(
                'with shell = true, command is one line of shell: command = ["..."]'
            )

    def names(self) -> set[str]:
        """The spec keys the command's placeholders name."""
        return placeholders(self.argv)

    def line(self, spec: Mapping[str, Any]) -> list[str]:
        """The argv for a child whose spec is ``spec``: each placeholder is replaced by its
        value as text, inside the one argument it is written in (``; rm -rf /`` stays one
        argument); with ``shell``, ``sh -c`` with each value quoted."""
        if self.shell:
            return ["/bin/sh", "-c", _fill(self.argv[0], spec, shlex.quote)]
        return [_fill(a, spec, str) for a in self.argv]


def _fill(text: str, spec: Mapping[str, Any], quote: Any) -> str:
    def value(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "$"
        found = spec[m.group(1)]
        shown = found if isinstance(found, str) else json.dumps(found)
        return str(quote(shown))

    return PLACEHOLDER.sub(value, text)


def message(line: str) -> tuple[str, Any] | None:
    """``("checkpoint", value)`` or ``("result", value)`` for a protocol line the command
    printed, None for any other line; a protocol line whose JSON is bad fails the attempt."""
    for prefix, kind in ((CHECKPOINT, "checkpoint"), (RESULT, "result")):
        if line.startswith(prefix):
            try:
                return kind, json.loads(line[len(prefix) :])
            except ValueError as exc:
                raise CommandFailed(
                    f"the command printed a {prefix.strip()} line that is not JSON ({exc}):"
                    f" {line[:200]!r}"
                ) from None
    return None


def done_of(checkpoint: Any) -> int | None:
    """How many numbers of its range a stealable command's checkpoint says are done
    (``{"done": k, ...}``); None for another checkpoint."""
    done = checkpoint.get("done") if isinstance(checkpoint, dict) else None
    return done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else None


def exit_error(code: int, stderr: Sequence[str]) -> str:
    """The failed attempt's error: the exit code (or the signal) and the end of stderr."""
    how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
    tail = "".join(stderr).strip()
    return f"the command {how}" + (f"; its stderr ended with:\n{tail}" if tail else "")
