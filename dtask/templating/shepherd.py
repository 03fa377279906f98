"""The process between a pool process and a command: ``python -I -S shepherd.py POOL GRACE FD
ARGV...``. It runs the command in a session of its own and, being a subreaper
(PR_SET_CHILD_SUBREAPER, set by the pool process before the exec), inherits every process
the command leaves behind, even one that called setsid or forked twice. So whatever the end,
the whole tree goes with it:

- the command exits: what it left running gets SIGTERM, then SIGKILL after GRACE seconds;
- SIGTERM (a drain, a cancel, the execution cap): the same for the whole tree at once;
- its pool process dies (SIGHUP, its PR_SET_PDEATHSIG, or a parent that is not POOL any more):
  SIGKILL for the whole tree at once, as another worker resumes the child.

It exits last, with the command's own status. FD (-1: none) becomes the command's file
descriptor 3, its protocol lines' pipe. Standard library only, no site-packages: it starts in
about 15 ms."""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing itself costs this process's start 8 ms
if TYPE_CHECKING:
    import signal
else:  # the same functions without the enum module that signal imports: 4 ms sooner
    import _signal as signal

_WANTED = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}


def main(argv: list[str]) -> None:
    pool, grace, fd, command = int(argv[0]), float(argv[1]), int(argv[2]), argv[3:]
    signal.pthread_sigmask(signal.SIG_BLOCK, _WANTED)
    leader = os.fork()
    if leader == 0:
        _exec(command, fd)
    if fd >= 0:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # its copy of the command's stdout closed: the reader sees the end
    status: int | None = None
    kill_at: float | None = None  # when what is left gets SIGKILL
    while True:
        status, alive = _reap(leader, status)
        if not alive:  # nothing left: a subreaper would have inherited it
            _exit_as(status)
        now = time.monotonic()
        if os.getppid() != pool:
            kill_at = now
        if kill_at is not None and now >= kill_at:
            _signal(signal.SIGKILL)
        elif status is not None and kill_at is None:
            _signal(signal.SIGTERM)  # the command ended: the rest of its tree is asked to stop
            kill_at = now + grace
        wait = 1.0 if kill_at is None else min(max(kill_at - now, 0.0), 1.0)
        info = signal.sigtimedwait(_WANTED, wait if wait > 0 else 0.05)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGHUP:
            kill_at = time.monotonic()
        elif kill_at is None:
            _signal(signal.SIGTERM)
            kill_at = time.monotonic() + grace


def _exec(command: list[str], fd: int) -> None:
    try:
        os.setsid()
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by Python, not by a command
            signal.signal(sig, signal.SIG_DFL)
        if fd >= 0:
            os.dup2(fd, 3)  # inheritable, whatever fd was
            if fd != 3:
                os.close(fd)
        os.execvp(command[0], command)
    except OSError as exc:
        os.write(2, f"dtask-shepherd: could not start: {exc.strerror}\n".encode())
    finally:
        os._exit(127)


def _reap(leader: int, status: int | None) -> tuple[int | None, bool]:
    """Waits for every child that has ended: the leader's status once it has, and whether
    any child is left."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status, False
        if pid == 0:
            return status, True
        if pid == leader:
            status = code


def _signal(sig: signal.Signals) -> None:
    for pid in _descendants(os.getpid()):
        try:  # noqa: SIM105 (contextlib costs this process's start 1 ms)
            os.kill(pid, sig)
        except ProcessLookupError:  # ended meanwhile
            pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _exit_as(status: int | None) -> None:
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # which has no disposition to set
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if status is not None else 127)


if __name__ == "__main__":
    main(sys.argv[1:])
