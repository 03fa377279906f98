"""A command template's child: its command run under a shepherd (dtask/templating/shepherd.py)
that takes the command's whole process tree with it, whether the command ends, is asked to
stop (a drain, a cancel, the execution cap: SIGTERM, SIGKILL after the grace) or its pool
process dies. The command sees a clean environment (dtask/domain/commands.py) and talks to
dtask through file descriptor 3 (or its stdout, where its template says so):
``::checkpoint {json}`` commits a checkpoint (the next attempt reads it from
DTASK_CHECKPOINT), ``::result {json}`` is the child's result. Its output is read in bounded
chunks: a line longer than DTASK_MAX_OUTPUT_LINE is cut, a protocol line longer than its
limit fails the attempt, and nothing a command prints is ever buffered whole.
A stealable command (``stealable = true``) reads one line from its stdin after each of its
checkpoints: the last number of its range, moved earlier where a steal took the rest."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dtask.domain.commands import (
    CHECKPOINT,
    PROTOCOL_FD,
    RESULT,
    Command,
    done_of,
    exit_error,
    message,
)
from dtask.domain.context import ChildContext
from dtask.domain.lines import LastBytes, Line, Lines
from dtask.exceptions import ChildStopped, CommandFailed

STDERR_KEPT = 40  # lines of the command's stderr kept for a failed attempt's error
STDERR_BYTES = 8192  # ... of its last bytes
CHUNK = 65536  # bytes read from a pipe at a time
PROTOCOL_LINE = 1 << 20  # a protocol line's JSON where the context sets no limit
POLL = 0.2  # seconds between looks at a stop request while the command prints nothing
SHEPHERD = str(Path(__file__).with_name("shepherd.py"))
_NOT_STARTED = "dtask-shepherd: could not start: "
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


class CommandChild:
    """The child function of a command template: ``ctx`` and the child's spec in, the
    command's ``::result`` out (None without one)."""

    def __init__(self, command: Command, origin: str) -> None:
        self.command = command
        # where it was declared: the registry tells two files' templates of one name apart
        self.__module__, self.__qualname__ = origin, "command"

    def __call__(self, ctx: ChildContext, **spec: Any) -> Any:
        command = self.command
        argv = command.line(spec)
        read_fd, write_fd = os.pipe() if command.protocol == "fd" else (-1, -1)
        protocol = {
            "DTASK_CHECKPOINT": json.dumps(ctx.checkpoint_state),
            "DTASK_RUN_ID": str(ctx.run_id),
            "DTASK_CHILD_INDEX": str(ctx.index),
            "DTASK_ATTEMPT": str(ctx.attempt),
            **({"DTASK_PROTOCOL_FD": str(PROTOCOL_FD)} if write_fd >= 0 else {}),
        }
        shepherd = [sys.executable, "-I", "-S", SHEPHERD, str(os.getpid()), str(command.grace)]
        try:
            proc = subprocess.Popen(
                [*shepherd, str(write_fd), *argv],
                env=command.environment(os.environ, protocol), cwd=command.cwd,
                stdin=subprocess.PIPE if command.stealable else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(write_fd,) if write_fd >= 0 else (),
                start_new_session=True, preexec_fn=_shepherd,
            )  # fmt: skip
        except OSError as exc:  # no such folder
            raise CommandFailed(self._not_started(argv, exc.strerror or str(exc))) from None
        finally:
            if write_fd >= 0:
                os.close(write_fd)
        if proc.stdin is not None:  # a command that stops reading never blocks the child
            os.set_blocking(proc.stdin.fileno(), False)
        try:
            with proc:  # its pipes closed and the shepherd waited for, however it ends
                result, code, stderr = _Follow(proc, read_fd, ctx, command).run()
        finally:
            if read_fd >= 0:
                os.close(read_fd)
        if code == 127 and stderr and stderr[-1].startswith(_NOT_STARTED):
            raise CommandFailed(self._not_started(argv, stderr[-1][len(_NOT_STARTED) :].strip()))
        if code != 0:
            raise CommandFailed(exit_error(code, stderr))
        return result

    def _not_started(self, argv: list[str], why: str | None) -> str:
        where = f" in {self.command.cwd}" if self.command.cwd else ""
        return f"the command {argv[0]!r} could not start{where}: {why}"


class _Follow:
    """Reads the command's stdout, stderr and protocol pipe until they close, between reads
    (at least every POLL s) stopping it where the child must stop (a drain, a cancel, the
    execution cap) or lost its lease: its last checkpoint is committed again and ChildStopped
    or LeaseLost raised."""

    def __init__(
        self, proc: subprocess.Popen[bytes], protocol: int, ctx: ChildContext, command: Command
    ) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self.proc, self.ctx, self.command = proc, ctx, command
        self.result: Any = None
        self.stderr = LastBytes(STDERR_BYTES)
        self.selector = selectors.DefaultSelector()
        most = max(ctx.max_checkpoint or PROTOCOL_LINE, ctx.max_result or PROTOCOL_LINE)
        self.limit = len(CHECKPOINT) + most
        # on stdout, a protocol line may be as long as on its own pipe
        line = ctx.max_output_line if protocol >= 0 else max(ctx.max_output_line, self.limit)
        self.selector.register(proc.stdout.fileno(), selectors.EVENT_READ, Lines(line))
        self.selector.register(proc.stderr.fileno(), selectors.EVENT_READ, self.stderr)
        if protocol >= 0:
            self.selector.register(protocol, selectors.EVENT_READ, Lines(self.limit))
        self.protocol = protocol if protocol >= 0 else proc.stdout.fileno()

    def run(self) -> tuple[Any, int, list[str]]:
        """Until the command's pipes close: its result, exit code and the end of its stderr."""
        try:
            with self.selector:
                while self.selector.get_map():
                    for key, _ in self.selector.select(POLL):
                        self._read(key)
                    if self.ctx.should_stop():
                        self.ctx.checkpoint(self.ctx.checkpoint_state)
                        raise ChildStopped(f"run {self.ctx.run_id} child {self.ctx.index} stopped")
            code = self.proc.wait()
        except BaseException:
            _stop(self.proc, self.command.grace)
            raise
        return self.result, code, self.stderr.lines(STDERR_KEPT)

    def _read(self, key: selectors.SelectorKey) -> None:
        fd, reader = key.fd, key.data
        chunk = os.read(fd, CHUNK)
        if isinstance(reader, LastBytes):
            reader.feed(chunk)
        elif chunk:
            for line in reader.feed(chunk):
                self._line(fd, line)
            if fd == self.protocol and self.command.protocol == "fd" and reader.dropped:
                self._too_long(reader.limit + reader.dropped)  # not waiting for its end
        if not chunk:
            self.selector.unregister(fd)
            end = reader.end() if isinstance(reader, Lines) else None
            if end is not None:
                self._line(fd, end)

    def _line(self, fd: int, line: Line) -> None:
        protocol = fd == self.protocol
        if protocol and line.dropped and (self.command.protocol == "fd" or _spoken(line)):
            self._too_long(len(line.data) + line.dropped)
        said = message(line.data.decode(errors="replace")) if protocol else None
        if said is None:
            if fd == self.protocol and self.command.protocol == "fd":
                raise CommandFailed(
                    f"the command wrote a line to its file descriptor {PROTOCOL_FD} that is not"
                    f" ::checkpoint or ::result: {line.text()[:200]!r}"
                )
            self.ctx.output(line.text() + "\n")
        elif said[0] == "checkpoint":
            self.ctx.checkpoint(said[1])  # raises when the child must stop
            if self.proc.stdin is not None:
                _reply(self.proc.stdin.fileno(), self.ctx.give_away(done_of(said[1])))
        else:
            self.result = said[1]

    def _too_long(self, size: int) -> None:
        raise CommandFailed(
            f"the command wrote a protocol line of {size:,} bytes or more, over the limit of"
            f" {self.limit:,} (DTASK_MAX_CHECKPOINT, DTASK_MAX_CHILD_RESULT)"
        )


def _spoken(line: Line) -> bool:
    return line.data.startswith((CHECKPOINT.encode(), RESULT.encode()))


def _reply(stdin: int, end: int | None) -> None:
    """The range's end, after a checkpoint, to a stealable command; dropped when it is not
    reading (its pipe full) or gone."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(stdin, f"{'' if end is None else end}\n".encode())


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the shepherd, which stops the command's whole tree (SIGKILL after
    ``grace``); SIGKILL to the shepherd if it has not ended 5 s after that."""
    for sig, wait in ((signal.SIGTERM, grace + 5.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)


def _shepherd() -> None:
    """In the shepherd's process, before its exec: SIGHUP when the pool process dies, and the
    command's orphans its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
