"""A large run's first message leaves before the split's ANALYZE (dtask.worker.tasks,
``refresh_statistics``), so what it runs through (the dispatcher's take, the claim, the
start, the batch's successes) is planned from statistics that have never seen the run: those
of a table of finished children. Each statement must still go through the run's indexes,
never read the table: on a table of a million children a sequential scan is a second per
message. ``python -m bench.plans`` shows the same on a million rows."""

from __future__ import annotations

import json
import os
import re
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

# finished children already in the table; DTASK_TEST_FINISHED=1000000 for the size
FINISHED = int(os.environ.get("DTASK_TEST_FINISHED", "200000"))
CHILDREN, MESSAGE = 10_000, 400
SEQ = re.compile(r"Seq Scan on dtask_children")


@pytest.fixture(scope="module")
def finished_table(dtask_env: dict[str, str]) -> Iterator[Store]:
    """A database of its own, holding FINISHED succeeded children of earlier runs, its
    statistics taken of them."""
    with new_database("firstplans") as url:
        limits = Limits()
        engine = engine_for(url, limits=limits)
        try:
            ensure(engine, migrate=True)
            store = Store(Database(engine, limits))
            runs = 10
            for i in range(runs):
                run_id, _ = store.runs.create(NewRun("t", f"test:old-{i}", {}, 3, None))
                with store.db.tx() as conn:
                    conn.execute(
                        sql(
                            "INSERT INTO dtask_children (run_id, index, spec, max_attempts,"
                            " state, attempt, started_at, finished_at, result)"
                            " SELECT :id, g, jsonb_build_object('i', g), 3, 'succeeded', 1,"
                            " now(), now(), 'null' FROM generate_series(0, :n - 1) g"
                        ),
                        {"id": run_id, "n": FINISHED // runs},
                    )
                    conn.execute(
                        sql("UPDATE dtask_runs SET state = 'succeeded' WHERE id = :id"),
                        {"id": run_id},
                    )
            with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(sql("VACUUM ANALYZE dtask_children"))
            yield store
        finally:
            engine.dispose()


def explained(store: Store, plans: list[tuple[str, list[str]]]) -> Any:
    """A listener that EXPLAINs (ANALYZE, rolled back) each statement on dtask_children
    before it runs."""

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "dtask_children" not in statement or statement.lstrip().upper().startswith("COPY"):
            return
        with cursor.connection.transaction():
            rows = cursor.connection.execute(f"EXPLAIN (ANALYZE) {statement}", parameters)
            plans.append((" ".join(statement.split())[:120], [r[0] for r in rows]))
            raise psycopg.Rollback()

    return explain


def test_a_new_runs_first_message_goes_through_its_indexes_without_fresh_statistics(
    finished_table: Store,
) -> None:
    store = finished_table
    run_id, _ = store.runs.create(NewRun("t", "test:new", {}, 3, None))
    plan = [{"i": i} for i in range(CHILDREN)]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    plans: list[tuple[str, list[str]]] = []
    listener = explained(store, plans)
    event.listen(store.engine, "before_cursor_execute", listener)
    try:
        assert store.runs.dispatch(run_id, lambda run, children: None, deferred=True) is (
            RunState.RUNNING
        )
        dispatched = len(plans)  # the split's count of what it left unsent reads them all
        with store.dispatch.turn() as turn:
            assert turn is not None
            sent = [c for m in turn.take(run_id, MESSAGE, MESSAGE) for c in m]
        assert [c.index for c in sent] == list(range(MESSAGE))
        claims = store.children.claim_many(run_id, [c.index for c in sent], "w:1", 60)
        assert sorted(claims) == list(range(MESSAGE))
        first = store.children.start(claims[0], 60)
        assert first is not None
        done = [Finished(c, None, json.dumps(i)) for i, c in sorted(claims.items()) if i]
        written, _ = store.children.write_batch(done, None, 60)
        assert len(written) == MESSAGE - 1
    finally:
        event.remove(store.engine, "before_cursor_execute", listener)
    assert len(plans) >= 4, [s for s, _ in plans]
    scanned = [(s, p) for s, p in plans if any(SEQ.search(line) for line in p)]
    assert not scanned, "\n\n".join(f"{s}\n" + "\n".join(p) for s, p in scanned)
    # nor the rest of the run: the take read every unsent child (through the sent_at index,
    # then sorted them), the claim every child of the run, before their rows were analyzed
    wide = [(s, p) for s, p in plans[dispatched:] if read(p) > 2 * MESSAGE]
    assert not wide, "\n\n".join(f"{s}: {read(p)} rows\n" + "\n".join(p) for s, p in wide)


ACTUAL = re.compile(r"actual time=\S+ rows=(\d+) loops=(\d+)")
REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck): (\d+)")


def read(plan: list[str]) -> int:
    """The rows of dtask_children a plan's scans went through: those they returned and those
    their filters removed."""
    rows, scanning = 0, False
    for line in plan:
        if "->" in line or line is plan[0]:
            scanning = "Scan" in line and "on dtask_children" in line
            found = ACTUAL.search(line)
            if scanning and found:
                rows += int(found[1]) * int(found[2])
        elif scanning and (removed := REMOVED.search(line)):
            rows += int(removed[1])
    return rows
