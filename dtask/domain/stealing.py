"""Straggler stealing's rule: which running range child gives work away, and where its range
is cut. Pure: the dispatcher asks (``pick``), the child cuts at its next checkpoint (``cut``),
and the store commits the shrink before the new child exists (docs/elastic.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dtask.domain.dispatch import BATCH_SECONDS

MIN_PIECE = 2  # numbers: never give away fewer, never keep fewer
# a child closer to its end is not worth a new child's start-up; far above BATCH_SECONDS, so
# a child short enough to share a message with others is never cut
MIN_SECONDS_LEFT = max(2.0, 40 * BATCH_SECONDS)
MAX_CUTS = 8  # a child's range is cut at most this many times (its pieces' pieces count too)


@dataclass(frozen=True)
class Running:
    """A running range child as the dispatcher sees it: its range ``[a, b]``, the numbers its
    last checkpoint says are done, for how long its attempt has run, and how many cuts made
    its range what it is."""

    run_id: int
    index: int
    a: int
    b: int
    done: int
    seconds: float
    cuts: int = 0

    @property
    def left(self) -> int:
        return max(0, self.b - self.a + 1 - self.done)

    def seconds_left(self) -> float | None:
        """Its estimated time to finish at its rate so far; None before its first checkpoint
        (no rate yet: it is not picked)."""
        if self.done <= 0 or self.seconds <= 0:
            return None
        return self.left * self.seconds / self.done


def cut(a: int, b: int, done: int, min_piece: int = MIN_PIECE) -> int | None:
    """The first number a child of ``[a, b]`` that has done ``done`` numbers gives away: the
    second half of what it has not done (it keeps the larger half). None when either piece
    would be smaller than ``min_piece``."""
    left = b - (a + done) + 1
    give = left // 2
    if give < min_piece or left - give < min_piece:
        return None
    return b - give + 1


def pick(
    candidates: Iterable[Running],
    min_seconds: float = MIN_SECONDS_LEFT,
    max_cuts: int = MAX_CUTS,
) -> Running | None:
    """The child with the most work left (by its rate), among those that are worth cutting:
    measured, at least ``min_seconds`` from their end, cut fewer than ``max_cuts`` times, and
    long enough to leave two pieces. Ties go to the lower run id, then index."""
    best: tuple[float, int, int] | None = None
    chosen = None
    for child in candidates:
        seconds = child.seconds_left()
        if seconds is None or seconds < min_seconds or child.cuts >= max_cuts:
            continue
        if cut(child.a, child.b, child.done) is None:
            continue
        key = (-seconds, child.run_id, child.index)
        if best is None or key < best:
            best, chosen = key, child
    return chosen
