from __future__ import annotations

import io
from datetime import UTC, datetime

from dtask.domain.runs import ChildCounts, RunState, RunStatus
from dtask.progress import Progress, describe


def status(done: int, total: int, state: RunState = RunState.RUNNING) -> RunStatus:
    return RunStatus(
        id=7, template="t", key="k", state=state, variables={},
        children=ChildCounts.from_states({"succeeded": done, "pending": total - done}),
        created_at=datetime(2026, 1, 1, tzinfo=UTC), finished_at=None, error=None,
    )  # fmt: skip


def test_describe_shows_bar_counts_and_eta() -> None:
    line = describe(status(50, 100), 10.0, rate=5.0)
    assert "[###############---------------] 50/100 children" in line
    assert "ETA 10 s" in line


def test_plain_output_is_lines_not_redraws() -> None:
    out = io.StringIO()
    progress = Progress(out, plain_every=0)
    progress(status(0, 10))
    progress(status(5, 10))
    progress(status(10, 10, RunState.SUCCEEDED))
    text = out.getvalue()
    assert "\r" not in text
    assert text.count("\n") == 3
    assert text.splitlines()[-1].endswith("succeeded")
