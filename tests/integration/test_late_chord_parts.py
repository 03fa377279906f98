"""A chord part that comes after its run was finalized (the failed last child's own, a child
finishing at a cancel) leaves nothing in the result backend, on whichever Celery runs this:
Celery 5.7's Redis backend ignores it (the done marker ``forget_chord`` sets); before 5.7
Celery counts it in a new join list, which the child task's post-run step then deletes.
`make test-floor` runs this on the lowest Celery dtask admits, `make test` on the newest."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery import states
from celery.app.task import Context

from dtask.worker import configure
from dtask.worker.finalize import _after_part
from dtask.worker.messages import chord_callback, forget_chord
from dtask.worker.task_table import CHILD


@pytest.fixture
def backend(dtask_env: dict[str, str]) -> Any:
    return configure().backend


def part(backend: Any, group: str, index: int, state: str = states.SUCCESS) -> None:
    """Child ``index``'s part as a worker reports it: Celery's own ``on_chord_part_return``,
    then the post-run step of dtask's child task."""
    request = Context(
        id=f"{group}.{index}", group=group, group_index=index, chord=chord_callback(1, group)
    )
    result = None if state == states.SUCCESS else ValueError("poison")
    backend.on_chord_part_return(request, state, result)
    task = SimpleNamespace(name=CHILD, request=request)
    _after_part(sender=task, task=task, state=state)


def keys(backend: Any, group: str) -> list[bytes]:
    """The group's keys but the done marker (which expires within the hour)."""
    found = backend.client.scan_iter(match=f"*{group}*", count=1000)
    return sorted(k for k in found if not k.endswith(b".c"))


def test_a_part_after_the_runs_end_leaves_no_key(backend: Any) -> None:
    group = f"dtask-late-{uuid.uuid4()}"
    backend.set_chord_size(group, 3)
    part(backend, group, 0)
    assert keys(backend, group)  # a chord in progress keeps its join list and size
    forget_chord(group)  # the run ended (its failed last child finalized it)
    assert keys(backend, group) == []
    part(backend, group, 1, states.FAILURE)  # that child's own part, then one finishing late
    part(backend, group, 2)
    assert keys(backend, group) == []


def test_a_part_of_a_chord_in_progress_stays(backend: Any) -> None:
    group = f"dtask-live-{uuid.uuid4()}"
    backend.set_chord_size(group, 2)
    part(backend, group, 0)
    assert len(keys(backend, group)) >= 2  # its join list and its size: the chord counts on
    forget_chord(group)
    assert keys(backend, group) == []
