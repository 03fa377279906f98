"""A command template's child: its command run as a subprocess of the pool process, never
outliving it (PR_SET_PDEATHSIG: a SIGKILLed pool process takes its command along), in a
session of its own (SIGTERM, then SIGKILL after the grace, reach the command's own children
on a drain, a cancel or the execution cap). It talks to dtask through its stdout:
``::checkpoint {json}`` commits a checkpoint (the next attempt reads it from
DTASK_CHECKPOINT), ``::result {json}`` is the child's result; every other line is its output.
A stealable command (``stealable = true``) reads one line from its stdin after each of its
checkpoints: the last number of its range, moved earlier where a steal took the rest."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import IO, Any

from dtask.domain.commands import Command, done_of, exit_error, message
from dtask.domain.context import ChildContext
from dtask.exceptions import ChildStopped, CommandFailed

STDERR_KEPT = 40  # lines of the command's stderr kept for a failed attempt's error
POLL = 0.2  # seconds between looks at a stop request while the command prints nothing
_PR_SET_PDEATHSIG = 1


class CommandChild:
    """The child function of a command template: ``ctx`` and the child's spec in, the
    command's ``::result`` out (None without one)."""

    def __init__(self, command: Command, origin: str) -> None:
        self.command = command
        # where it was declared: the registry tells two files' templates of one name apart
        self.__module__, self.__qualname__ = origin, "command"

    def __call__(self, ctx: ChildContext, **spec: Any) -> Any:
        command = self.command
        env = {
            **os.environ,
            **command.env,
            "DTASK_CHECKPOINT": json.dumps(ctx.checkpoint_state),
            "DTASK_RUN_ID": str(ctx.run_id),
            "DTASK_CHILD_INDEX": str(ctx.index),
            "DTASK_ATTEMPT": str(ctx.attempt),
        }
        argv = command.line(spec)
        try:
            proc = subprocess.Popen(
                argv, env=env, cwd=command.cwd,
                stdin=subprocess.PIPE if command.stealable else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        except OSError as exc:  # not found, not executable, no such folder
            where = f" in {command.cwd}" if command.cwd else ""
            why = f"the command {argv[0]!r} could not start{where}: {exc.strerror}"
            raise CommandFailed(why) from None
        if proc.stdin is not None:  # a command that stops reading never blocks the child
            os.set_blocking(proc.stdin.fileno(), False)
        with proc:  # its pipes closed and the process waited for, however it ends
            result, code, stderr = self._follow(proc, ctx)
        if code != 0:
            raise CommandFailed(exit_error(code, stderr))
        return result

    def _follow(self, proc: subprocess.Popen[str], ctx: ChildContext) -> tuple[Any, int, list[str]]:
        """Until the command exits: its result, exit code and the end of its stderr."""
        assert proc.stdout is not None and proc.stderr is not None
        stderr: collections.deque[str] = collections.deque(maxlen=STDERR_KEPT)
        errors = threading.Thread(target=_keep, args=(proc.stderr, stderr), daemon=True)
        errors.start()
        result = None
        try:
            for line in _lines(proc.stdout, proc, ctx):
                said = message(line)
                if said is None:
                    print(line, end="" if line.endswith("\n") else "\n")
                elif said[0] == "checkpoint":
                    ctx.checkpoint(said[1])  # raises when the child must stop: see below
                    if proc.stdin is not None:
                        _reply(proc.stdin, ctx.give_away(done_of(said[1])))
                else:
                    result = said[1]
            code = proc.wait()
        except BaseException:
            _stop(proc, self.command.grace)
            raise
        errors.join(5)
        return result, code, list(stderr)


def _lines(stdout: IO[str], proc: subprocess.Popen[str], ctx: ChildContext) -> Iterator[str]:
    """The command's stdout lines; between them (at least every POLL s), a stop request
    (drain, cancel, execution cap) or a lost lease ends the child: its last checkpoint is
    committed again and ChildStopped or LeaseLost raised (the caller stops the command)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # closed under it: the command ended
            for line in stdout:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=POLL)
        except queue.Empty:
            line = ""
        if line is None:
            return
        if ctx.should_stop():
            ctx.checkpoint(ctx.checkpoint_state)
            raise ChildStopped(f"run {ctx.run_id} child {ctx.index} stopped")
        if line:
            yield line


def _reply(stdin: IO[str], end: int | None) -> None:
    """The range's end, after a checkpoint, to a stealable command; dropped when it is not
    reading (its pipe full) or gone."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(stdin.fileno(), f"{'' if end is None else end}\n".encode())


def _keep(stream: IO[str], kept: collections.deque[str]) -> None:
    with contextlib.suppress(ValueError, OSError):  # closed under it: the command ended
        kept.extend(stream)


def _stop(proc: subprocess.Popen[str], grace: float) -> None:
    """SIGTERM to the command's session, SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _die_with_parent() -> None:
    """In the command's process, before exec: SIGKILL when the pool process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
