"""Bytes read from a pipe as lines, never holding more than ``limit`` bytes of one line: a
longer line is kept as its first ``limit`` bytes and a count of the bytes dropped, so a
command printing gigabytes without a newline costs its reader ``limit`` bytes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    data: bytes  # its first ``limit`` bytes, without the newline
    dropped: int = 0  # bytes of it past the limit, not kept

    def text(self) -> str:
        shown = self.data.decode(errors="replace")
        return shown if not self.dropped else f"{shown} [line cut: {self.dropped:,} bytes more]"


class Lines:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept = bytearray()
        self._dropped = 0

    @property
    def dropped(self) -> int:
        """Bytes of the line under way dropped so far."""
        return self._dropped

    def feed(self, chunk: bytes) -> list[Line]:
        """The lines that ``chunk`` ends (the rest waits for the next chunk)."""
        done: list[Line] = []
        view = memoryview(chunk)
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            room = max(self.limit - len(self._kept), 0)
            take = min(room, end - start)
            self._kept += view[start : start + take]
            self._dropped += end - start - take
            if newline < 0:
                return done
            done.append(self._line())
            start = newline + 1

    def end(self) -> Line | None:
        """The last line, where the stream ended without a newline."""
        return self._line() if self._kept or self._dropped else None

    def _line(self) -> Line:
        line = Line(bytes(self._kept), self._dropped)
        self._kept.clear()
        self._dropped = 0
        return line


class LastBytes:
    """The last ``limit`` bytes of a stream (a command's stderr, for its error)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._kept += chunk[-self.limit :]
        del self._kept[: -self.limit]

    def lines(self, most: int) -> list[str]:
        """Its last ``most`` lines (the first one possibly cut), each with its newline."""
        text = self._kept.decode(errors="replace")
        return text.splitlines(keepends=True)[-most:]
