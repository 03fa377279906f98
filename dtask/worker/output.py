"""What a child printed (stdout, stderr, ``ctx.log``), its last ``limit`` characters
(DTASK_MAX_CHILD_LOG), kept with its attempt: the heartbeat writes it while the attempt runs
(`dtask logs --follow`), its end with the attempt's success or failure. Its first ``limit``
characters also go to the worker's log; of the rest, the log gets how many there were."""

from __future__ import annotations

import io
import threading
from collections import deque
from collections.abc import Iterable
from typing import TextIO


class Tail:
    """The last ``limit`` characters written to it, from any thread; ``written`` counts every
    character ever written, so a reader can tell what is new since it last looked."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.written = 0
        self.logged = 0  # characters passed to the worker's log
        self._chunks: deque[str] = deque()
        self._size = 0
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            self.written += len(text)
            if self.limit <= 0:
                return
            chunk = text[-self.limit :]
            self._chunks.append(chunk)
            self._size += len(chunk)
            while self._size - len(self._chunks[0]) >= self.limit:
                self._size -= len(self._chunks.popleft())

    def text(self) -> str | None:
        """What is kept (None: nothing was printed, or nothing is kept)."""
        return self.kept()[0]

    def kept(self) -> tuple[str | None, int]:
        """(what is kept, or None; how many characters before it were not kept)."""
        with self._lock:
            text = "".join(self._chunks)[-self.limit :] if self.limit > 0 else ""
            return text or None, self.written - len(text)

    def stream(self, through: TextIO) -> Through:
        return Through(through, self)

    def loggable(self, text: str) -> str:
        """The part of ``text`` the worker's log still takes (all of it until ``limit``
        characters were logged), counted as logged."""
        with self._lock:
            room = max(self.limit - self.logged, 0)
            shown = text[:room]
            self.logged += len(shown)
            return shown

    def unlogged(self) -> int:
        """Characters printed that the worker's log did not take."""
        with self._lock:
            return self.written - self.logged


class Through:
    """A stdout (or stderr) that writes through to ``through`` and into the tail, and answers
    as the ``io.TextIOBase`` it was does (registered as one): closing it leaves the worker's
    stream open, it has no file descriptor, it is no terminal. Not a subclass: one is made for
    each child, and an IOBase flushed the worker's stdout as it was freed and looked its
    ``closed`` state up through ``__getattr__`` (a failed lookup on the real stream each
    time): 13 % of a pool process's time on a run of no-op children, sampled by py-spy."""

    __slots__ = ("tail", "through")
    closed = False

    def __init__(self, through: TextIO, tail: Tail) -> None:
        self.through = through
        self.tail = tail

    def write(self, text: str) -> int:
        shown = self.tail.loggable(text)
        if shown:
            self.through.write(shown)
        self.tail.add(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.through.flush()

    def close(self) -> None:
        """A child that closes its stdout ends its own: the worker's stays open."""

    def __enter__(self) -> Through:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def encoding(self) -> str | None:
        return getattr(self.through, "encoding", None)

    @property
    def errors(self) -> str | None:
        return getattr(self.through, "errors", None)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def isatty(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> object:  # buffer, newlines...: the stream's
        return getattr(self.through, name)


io.TextIOBase.register(Through)
