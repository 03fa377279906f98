"""Waiting on a run reads one row per poll, whatever its size: its children are counted only
when it ends (or for a progress display, at a rate bounded by the count's own cost)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from dtask import services
from dtask.client.runs import Run
from dtask.db import Store
from dtask.domain.runs import NewRun, RunStatus
from dtask.exceptions import WaitTimeout


@pytest.fixture
def counted(dtask_env: dict[str, str]) -> Iterator[list[str]]:
    """Every statement this process sends that reads the children table."""
    engine = services.store().engine
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "dtask_children" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    yield seen
    event.remove(engine, "before_cursor_execute", note)


def big_run(store: Store, children: int) -> int:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    store.runs.split(run_id, lambda run, slots: [{"i": i} for i in range(children)])
    store.runs.dispatch(run_id, lambda run, kids: None)
    return run_id


def why_reads(run: Run, counted: list[str]) -> int:
    """The statements that read the children table in saying why the run waits."""
    counted.clear()
    run.waiting()
    return len(counted)


def test_wait_reads_the_runs_row_not_its_children_on_each_poll(counted: list[str]) -> None:
    run = Run(big_run(services.store(), 20_000))
    why = why_reads(run, counted)
    counted.clear()
    with pytest.raises(WaitTimeout, match=r"0/20000 children done.*: it waits because "):
        run.wait(timeout=1.5, poll=0.05)
    assert len(counted) == 1 + why  # the count and the reason in the timeout's message


def test_progress_is_counted_at_a_rate_bounded_by_the_counts_cost(counted: list[str]) -> None:
    run = Run(big_run(services.store(), 50_000))
    why = why_reads(run, counted)
    counted.clear()
    shown: list[RunStatus] = []
    with pytest.raises(WaitTimeout):
        run.wait(timeout=1.5, poll=0.05, on_progress=shown.append)
    assert shown and shown[0].children.total == 50_000
    assert len(counted) == len(shown) + 1 + why < 1.5 / 0.05  # fewer counts than polls
