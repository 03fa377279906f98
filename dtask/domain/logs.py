"""A child's attempts as `dtask logs` shows them: each attempt's last output, the worker that
ran it and how it ended. Pure: dtask/db/child_logs.py reads the rows (``dtask_child_logs`` for
failed and running attempts, the child's own row for its latest attempt); :func:`attempts`
puts them together, and :class:`Follower` says what is new since it last looked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from dtask.domain.runs import ChildState

LOST = "interrupted"  # an attempt that ran and printed, then ended without a word (a kill)


@dataclass(frozen=True)
class AttemptLog:
    index: int
    attempt: int
    worker: str | None  # host:pid of the pool process that ran it
    state: str  # running, succeeded, failed, interrupted
    output: str | None  # its last characters (DTASK_MAX_CHILD_LOG)
    skipped: int = 0  # characters before ``output`` not kept (a success's: not counted, 0)
    error: str | None = None
    at: datetime | None = None  # its last write

    def as_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "attempt": self.attempt,
            "worker": self.worker,
            "state": self.state,
            "output": self.output,
            "skipped": self.skipped,
            "error": self.error,
            "at": self.at.isoformat() if self.at else None,
        }


@dataclass(frozen=True)
class ChildNow:
    """A child's own row: its latest attempt, as far as it has ended."""

    index: int
    state: ChildState
    attempt: int
    worker: str | None
    output: str | None
    error: str | None
    at: datetime | None


def attempts(child: ChildNow, logged: Iterable[AttemptLog]) -> list[AttemptLog]:
    """The child's attempts in order: the logged ones (a running one that is not its current
    attempt any more was interrupted), with its succeeded (or failed) latest attempt from its
    own row where that is newer than what was logged of it."""
    found = {a.attempt: a for a in logged}
    for n, a in found.items():
        current = child.state is ChildState.RUNNING and n == child.attempt
        if a.state == "running" and not current and child.state is not ChildState.SUCCEEDED:
            found[n] = replace(a, state=LOST)
    if child.state is ChildState.SUCCEEDED:
        found[child.attempt] = AttemptLog(
            child.index, child.attempt, child.worker, "succeeded", child.output, 0, None, child.at
        )
        for n, a in found.items():
            if a.state == "running":
                found[n] = replace(a, state=LOST)
    elif child.state is ChildState.FAILED and child.attempt not in found and child.attempt:
        found[child.attempt] = AttemptLog(
            child.index, child.attempt, child.worker, "failed", child.output, 0, child.error,
            child.at,
        )  # fmt: skip
    return [found[n] for n in sorted(found)]


OVERLAP = 256  # characters matched to find where a tail that moved on continues


class Follower:
    """What is new in each attempt's output since the last call (``--follow``): an attempt
    seen for the first time is new whole; one seen before, what follows what was shown (by
    the characters counted before it, or, where those are unknown, by matching the end of
    what was shown). A state that changed is said once."""

    def __init__(self) -> None:
        self.shown: dict[tuple[int, int], tuple[int, str, str]] = {}  # end, last text, state

    def new(self, log: AttemptLog) -> tuple[bool, str, bool]:
        """(first time seen, the new text, whether its state changed)."""
        key = (log.index, log.attempt)
        text = log.output or ""
        end = log.skipped + len(text)
        if key not in self.shown:
            self.shown[key] = (end, text, log.state)
            return True, text, False
        was_end, was_text, was_state = self.shown[key]
        self.shown[key] = (max(end, was_end), text, log.state)
        if log.state != "succeeded":  # logged with what was not kept before it
            fresh = text[max(0, was_end - log.skipped) :] if end > was_end else ""
        else:  # a success's output comes from the child's row, without that count
            fresh = _after(was_text, text)
        return False, fresh, log.state != was_state


def _after(shown: str, text: str) -> str:
    """What follows ``shown`` in ``text`` (its end matched, as a tail moves on)."""
    if text.startswith(shown):
        return text[len(shown) :]
    probe = shown[-OVERLAP:]
    at = text.rfind(probe) if probe else -1
    return text[at + len(probe) :] if at >= 0 else text
