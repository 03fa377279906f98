"""What a process has seen a template's children take, from which a dtask.masters message
decides how many of its runs to run here (dtask/worker/inline_runs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dtask.domain.dispatch import BATCH_SECONDS, batch_size
from dtask.worker import inline_runs
from dtask.worker.inline_runs import SEEN, child_seconds, note_child_seconds


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    inline_runs._child_seconds.clear()
    yield
    inline_runs._child_seconds.clear()


def test_a_slow_first_child_or_a_busy_moment_does_not_make_short_children_look_long() -> None:
    assert child_seconds("tiny") is None
    note_child_seconds("tiny", 0.6)  # the process's first: its imports
    note_child_seconds("tiny", 0.002)
    note_child_seconds("tiny", 0.09)  # the machine was busy
    assert child_seconds("tiny") == 0.002
    assert batch_size(child_seconds("tiny")) > 10


def test_long_children_stay_long_and_a_template_that_became_long_is_seen_so() -> None:
    for _ in range(3):
        note_child_seconds("slow", 2.0)
    assert batch_size(child_seconds("slow")) == 1
    note_child_seconds("changed", 0.001)
    for _ in range(SEEN):
        note_child_seconds("changed", BATCH_SECONDS * 4)
    assert child_seconds("changed") == BATCH_SECONDS * 4
