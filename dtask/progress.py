"""Progress display for long waits: a redrawn bar on a terminal, plain lines elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from dtask.domain.runs import RunStatus

BAR_WIDTH = 30


def describe(
    status: RunStatus, elapsed: float, rate: float | None, items_per_child: int | None = None
) -> str:
    c = status.children
    if c.total == 0:
        return f"run {status.id} {status.state.value}  {elapsed:5.1f} s"
    filled = BAR_WIDTH * c.finished // c.total
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    parts = [
        f"run {status.id} [{bar}] {c.finished}/{c.total} children",
        f"{c.running} running",
    ]
    if c.failed:
        parts.append(f"{c.failed} failed")
    parts.append(f"{elapsed:.1f} s")
    if rate and items_per_child:
        parts.append(f"{rate * items_per_child:,.0f} items/s")
    if rate and not status.finished and c.finished < c.total:
        parts.append(f"ETA {(c.total - c.finished) / rate:.0f} s")
    parts.append(status.state.value)
    return "  ".join(parts)


class Progress:
    """Call with each new status. On a TTY it redraws one line; otherwise it prints a line
    when something changed, at most every ``plain_every`` seconds (and always the last one)."""

    def __init__(
        self,
        stream: TextIO = sys.stderr,
        plain_every: float = 5.0,
        items_per_child: int | None = None,
    ) -> None:
        self.stream = stream
        self.items_per_child = items_per_child
        self.tty = stream.isatty()
        self.plain_every = plain_every
        self.started = time.monotonic()
        self._last_line = ""
        self._last_print = 0.0
        self._first_done: tuple[float, int] | None = None

    def _rate(self, finished: int, now: float) -> float | None:
        if self._first_done is None:
            self._first_done = (now, finished)
            return None
        t0, n0 = self._first_done
        return (finished - n0) / (now - t0) if now > t0 and finished > n0 else None

    def __call__(self, status: RunStatus) -> None:
        now = time.monotonic()
        rate = self._rate(status.children.finished, now)
        line = describe(status, now - self.started, rate, self.items_per_child)
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + ("\n" if status.finished else ""))
            self.stream.flush()
            return
        changed = line.split("  ")[0] != self._last_line.split("  ")[0]
        if status.finished or (changed and now - self._last_print >= self.plain_every):
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_print = now
        self._last_line = line
