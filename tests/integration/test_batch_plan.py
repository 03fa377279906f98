"""A message's successes go in one statement, its children joined to the batch by id. Planned
from statistics taken at the split (no child running then), a statement that asked for
``state = 'running'`` as a constant scanned the running children first and read the whole
batch again for each of them: 80 ms for 400 children of a 10,000-child run, and quadratic in
the message's size. The batch is read once, whatever the statistics say."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import event

from dtask.db import Finished, Limits, Store, engine_for
from dtask.db.database import Database, sql
from dtask.db.schema import ensure
from dtask.domain.runs import NewRun, RunState
from tests.support.db import new_database

CHILDREN, MESSAGE = 10_000, 400


@pytest.fixture
def fresh(dtask_env: dict[str, str]) -> Iterator[Store]:
    """A database of its own: the plan depends on what dtask_children holds."""
    with new_database("batchplan") as url:
        limits = Limits()
        engine = engine_for(url, limits=limits)
        try:
            ensure(engine, migrate=True)
            yield Store(Database(engine, limits))
        finally:
            engine.dispose()


def function_scan_loops(plan: dict[str, Any]) -> list[int]:
    """How many times each scan of the batch's values ran."""
    found = [int(plan["Actual Loops"])] if plan.get("Node Type") == "Function Scan" else []
    for child in plan.get("Plans", []):
        found += function_scan_loops(child)
    return found


def test_a_message_s_successes_read_the_batch_once_whatever_the_statistics(
    fresh: Store,
) -> None:
    plan = [{"i": i} for i in range(CHILDREN)]
    for key in ("test:before", "test:plan"):  # each analyzed: no child is running
        run_id, _ = fresh.runs.create(NewRun("t", key, {}, 3, None))
        split = fresh.runs.split(run_id, lambda run, slots: plan, deferred=True)
        assert split is RunState.SPLITTING
        fresh.runs.refresh_statistics(CHILDREN)  # as a master does once its first message left
        if key == "test:before":  # a run that ran before this one: its children succeeded
            with fresh.db.tx() as conn:
                conn.execute(
                    sql("UPDATE dtask_children SET state = 'succeeded' WHERE run_id = :id"),
                    {"id": run_id},
                )
    claims = fresh.children.claim_many(run_id, list(range(MESSAGE)), "w:1", 60)
    done = [Finished(claim, None, json.dumps(i)) for i, claim in sorted(claims.items())]
    plans: list[Any] = []

    def explain_first(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        """EXPLAIN ANALYZE the batch's statement before it runs, rolled back."""
        if "UPDATE dtask_children c SET" not in statement or plans:
            return
        with cursor.connection.transaction():
            explain = cursor.connection.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
            )
            plans.append(explain.fetchone()[0][0]["Plan"])
            raise psycopg.Rollback()

    event.listen(fresh.engine, "before_cursor_execute", explain_first)
    try:
        finished, _ = fresh.children.write_batch(done, None, 60)
    finally:
        event.remove(fresh.engine, "before_cursor_execute", explain_first)
    assert finished == {claim.child_id for claim in claims.values()}
    assert len(plans) == 1
    loops = function_scan_loops(plans[0])
    assert loops and max(loops) == 1, f"the batch was read {max(loops)} times: {plans[0]}"
