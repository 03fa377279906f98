"""Command templates' pure part: a child's argv from its spec (a value is always one argument
and never shell text), the environment it runs in, and the lines it writes to talk to dtask.
The process itself is run by dtask/templating/commands.py."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dtask.domain import shell
from dtask.domain.placeholders import PLACEHOLDER, placeholders
from dtask.exceptions import CommandFailed, TemplateDefinitionError

CHECKPOINT, RESULT = "::checkpoint ", "::result "
GRACE = 10.0  # seconds from SIGTERM to SIGKILL when a command is asked to stop
PROTOCOL_FD = 3  # where a command writes its protocol lines (protocol = "fd", the default)
# what a command gets of the worker's environment without asking (env_pass names more)
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
# what dtask sets for every command: a template's env and env_pass may not name them
PROTOCOL_ENV = ("DTASK_RUN_ID", "DTASK_CHILD_INDEX", "DTASK_ATTEMPT", "DTASK_CHECKPOINT",
                "DTASK_PROTOCOL_FD")  # fmt: skip
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Command:
    """What a command template's child runs: ``argv`` with ``${key}`` placeholders naming the
    child's spec keys; run without a shell unless ``shell`` (then ``argv`` is one line of
    shell, whose placeholders become its positional parameters: dtask/domain/shell.py);
    ``env`` set for it and ``env_pass`` passed from the worker's environment, besides
    BASE_ENV and the protocol's; ``cwd`` its working directory (None: the worker's);
    ``protocol`` where its protocol lines are read: file descriptor 3, or its stdout (where
    a value it echoes could speak the protocol)."""

    argv: tuple[str, ...]
    shell: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    env_pass: tuple[str, ...] = ()
    cwd: str | None = None
    grace: float = GRACE
    stealable: bool = False  # it reads its range's end back after each checkpoint
    protocol: Literal["fd", "stdout"] = "fd"

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise TemplateDefinitionError("command must be a non-empty list of strings")
        if self.shell and len(self.argv) != 1:
            raise TemplateDefinitionError(
                'with shell = true, command is one line of shell: command = ["..."]'
            )
        if any("\0" in text for text in (*self.argv, *self.env.values())):
            raise TemplateDefinitionError("command and env may not hold a NUL character")
        if self.shell:
            shell.script(self.argv[0])  # a placeholder where a value would not stay data
        for key in ("env", "env_pass"):
            for name in getattr(self, key):
                if not _NAME.fullmatch(name):
                    raise TemplateDefinitionError(f"{key}: {name!r} is not a variable's name")
                if name in PROTOCOL_ENV:
                    raise TemplateDefinitionError(f"{key}: {name} is dtask's to set")
        if self.protocol not in ("fd", "stdout"):
            raise TemplateDefinitionError(
                f'protocol must be "fd" or "stdout", got {self.protocol!r}'
            )

    def names(self) -> set[str]:
        """The spec keys the command's placeholders name."""
        return placeholders(self.argv)

    def line(self, spec: Mapping[str, Any]) -> list[str]:
        """The argv for a child whose spec is ``spec``: each placeholder is replaced by its
        value as text, inside the one argument it is written in (``; rm -rf /`` stays one
        argument); with ``shell``, ``sh -c SCRIPT sh VALUE...``: the script is the line's
        own text, the same for every value, and the values are its arguments."""
        if self.shell:
            script = shell.script(self.argv[0])
            values = [_text(spec[name]) for name in script.names]
            return _checked(["/bin/sh", "-c", script.text, "sh", *values])
        return _checked([_fill(a, spec) for a in self.argv])

    def environment(self, worker: Mapping[str, str], protocol: Mapping[str, str]) -> dict[str, str]:
        """The command's whole environment: BASE_ENV and ``env_pass`` from the worker's,
        ``env``, then the protocol's variables (``protocol``); nothing else of the worker's
        (its DTASK_* settings hold the database's and the broker's credentials)."""
        passed = {k: worker[k] for k in (*BASE_ENV, *self.env_pass) if k in worker}
        return {**passed, **self.env, **protocol}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _fill(text: str, spec: Mapping[str, Any]) -> str:
    return PLACEHOLDER.sub(lambda m: "$" if m.group(1) is None else _text(spec[m.group(1)]), text)


def _checked(argv: list[str]) -> list[str]:
    if any("\0" in arg for arg in argv):
        raise CommandFailed("a value holds a NUL character, which no command argument can carry")
    return argv


def message(line: str) -> tuple[str, Any] | None:
    """``("checkpoint", value)`` or ``("result", value)`` for a protocol line the command
    wrote, None for any other line; a protocol line whose JSON is bad fails the attempt."""
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
