"""Reading dtask's tables from tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import text

from dtask import services


class ChildRow(NamedTuple):
    owner: str | None
    state: str
    attempt: int
    checkpoint: Any


def child_row(run_id: int, index: int) -> ChildRow:
    """One child; state "absent" before the master has split."""
    with services.store().engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT owner, state, attempt, checkpoint FROM dtask_children"
                " WHERE run_id = :r AND index = :i"
            ),
            {"r": run_id, "i": index},
        ).first()
    if row is None:
        return ChildRow(None, "absent", 0, None)
    return ChildRow(row.owner, row.state, row.attempt, row.checkpoint)


def children(run_id: int) -> list[tuple[int, str, int]]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT index, state, attempt FROM dtask_children WHERE run_id = :r ORDER BY index"
            ),
            {"r": run_id},
        )
        return [(int(i), str(s), int(a)) for i, s, a in rows]


def owner_pid(owner: str) -> int:
    return int(owner.rsplit(":", 1)[1])


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
