"""The last lines a child printed, at most KEPT characters, kept with its success or its failed
attempt (`dtask status RUN --child N`); what it prints still goes to the worker's log."""

from __future__ import annotations

import io
from collections import deque
from typing import TextIO

LINES, WIDTH = 20, 500
KEPT = 4096  # characters: a few KiB per child, whatever it prints


class Tail(io.TextIOBase):
    """A stdout that writes through and remembers the last ``LINES`` lines (each cut at
    ``WIDTH`` characters, so a child printing megabytes costs nothing here)."""

    def __init__(self, through: TextIO) -> None:
        self.through = through
        self._lines: deque[str] = deque(maxlen=LINES)
        self._partial = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.through.write(text)
        *done, self._partial = (self._partial + text).split("\n")
        self._lines.extend(line[:WIDTH] for line in done[-LINES:])
        self._partial = self._partial[:WIDTH]
        return len(text)

    def flush(self) -> None:
        self.through.flush()

    def __getattr__(self, name: str) -> object:  # fileno, encoding, isatty...: the stream's
        return getattr(self.through, name)

    def text(self) -> str | None:
        lines = [*self._lines, *([self._partial] if self._partial else [])]
        return "\n".join(lines[-LINES:])[-KEPT:] or None
