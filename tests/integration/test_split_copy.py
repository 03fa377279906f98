"""A split's COPY runs with PostgreSQL's own plan cache: each row's foreign-key check is a
query PostgreSQL prepares once, and under dtask's ``plan_cache_mode = force_custom_plan`` it
was planned again for every row (two thirds of a 10,000-child COPY's time). The setting is
the session's again after the COPY. A trigger of the test's own notes what each row saw."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from dtask import services
from dtask.db import Store
from dtask.db.database import sql
from dtask.db.pooler import PLANNED_EACH_TIME
from dtask.domain.runs import NewRun, RunState


@pytest.fixture
def noted(dtask_env: dict[str, str]) -> Iterator[Store]:
    store = services.store()
    with store.db.tx() as conn:
        conn.execute(sql("CREATE TABLE test_plan_modes (run_id bigint, mode text)"))
        conn.execute(
            sql(
                "CREATE FUNCTION test_note_mode() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                " INSERT INTO test_plan_modes VALUES (NEW.run_id,"
                " current_setting('plan_cache_mode')); RETURN NEW; END $$"
            )
        )
        conn.execute(
            sql(
                "CREATE TRIGGER test_note_mode BEFORE INSERT ON dtask_children"
                " FOR EACH ROW EXECUTE FUNCTION test_note_mode()"
            )
        )
    try:
        yield store
    finally:
        with store.db.tx() as conn:
            conn.execute(sql("DROP TRIGGER test_note_mode ON dtask_children"))
            conn.execute(sql("DROP FUNCTION test_note_mode()"))
            conn.execute(sql("DROP TABLE test_plan_modes"))


def modes(store: Store, run_id: int) -> list[str]:
    with store.db.tx() as conn:
        found = conn.execute(
            sql("SELECT mode FROM test_plan_modes WHERE run_id = :id"), {"id": run_id}
        )
        return [str(mode) for (mode,) in found]


@pytest.mark.parametrize("deferred", [True, False], ids=["window", "all"])
def test_a_split_copies_its_children_with_the_default_plan_cache(
    noted: Store, deferred: bool
) -> None:
    run_id, _ = noted.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    plan = [{"i": i} for i in range(50)]
    state = noted.runs.split(run_id, lambda run, slots: plan, deferred=deferred)
    assert state is RunState.SPLITTING
    assert modes(noted, run_id) == ["auto"] * 50
    with noted.db.tx() as conn:  # the session's own setting, for every statement after it
        setting = conn.execute(sql("SELECT current_setting('plan_cache_mode')")).scalar_one()
    assert setting == PLANNED_EACH_TIME
