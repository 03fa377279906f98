"""Straggler stealing inside a message of several children (docs/elastic.md), on the worker's
own code path run in this process against PostgreSQL: a message of three range children whose
middle one is slow; asked to give work away, it cuts its rest at its next checkpoint from inside
the message, the new child joins the run, and the message's other children run as before.
(With real workers, whether a straggler shares a message depends on how the dispatcher timed
the run's first children: a busy machine sends them one to a message.)"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from dtask import services
from dtask.db import Store
from dtask.domain.runs import NewRun, RunState
from dtask.worker.batch import children as children_message
from tests.support.db import child_row, children, wait_for

SLOW = [11, 30, 0.2]  # numbers 11..30, 0.2 s each: the middle child


@pytest.mark.parametrize("claimed", ["per_child", "as_one_row"])
def test_a_straggler_in_a_message_of_three_gives_its_rest_away(
    dtask_env: dict[str, str], sink: Path, claimed: str
) -> None:
    """``as_one_row``: the message is the dispatcher's, claimed as one row
    (db/message_claims.py), its straggler covered by it; ``per_child``: a message of no
    dispatcher's (a hand-over), its children claimed each under a fence of its own."""
    from dtask.worker import configure

    configure()
    store: Store = services.store()
    run_id, _ = store.runs.create(
        NewRun("batched_straggler", f"test:{uuid.uuid4()}", {"n": 40}, 1, None)
    )
    plan = [{"a": a, "b": b, "slow": SLOW} for a, b in ((1, 10), (11, 30), (31, 40))]
    assert store.runs.split(run_id, lambda run, slots: plan, deferred=True) is RunState.SPLITTING
    assert store.runs.dispatch(run_id, lambda run, kids: None, deferred=True) is RunState.RUNNING
    if claimed == "as_one_row":
        with store.dispatch.turn() as turn:
            assert turn is not None
            assert [len(m) for m in turn.take(run_id, 3, 3)] == [3]
    group = f"group-{uuid.uuid4()}"
    items = [[i, spec] for i, spec in enumerate(plan)]

    def ask_once_measured() -> None:  # the dispatcher's ask, once the straggler has a rate
        wait_for(lambda: (child_row(run_id, 1).checkpoint or {}).get("done"), 30, "a rate")
        assert store.steals.ask(run_id, 1)

    asker = threading.Thread(target=ask_once_measured)
    asker.start()
    result = children_message.apply(args=(run_id, "batched_straggler", group, None, items))
    asker.join(30)
    rows = {index: (state, attempt) for index, state, attempt in children(run_id)}
    assert rows[0] == rows[1] == rows[2] == ("succeeded", 1)
    assert set(rows) == {0, 1, 2, 3}, "no new child"
    kept, given = (store.children.detail(run_id, i).spec for i in (1, 3))  # type: ignore[union-attr]
    assert kept["a"] == 11 and given["b"] == 30 and given["a"] == kept["b"] + 1
    assert given["a"] > 12  # after some were done: the second half of the rest
    ran = sink / f"{run_id}-1.txt"
    numbers = [int(line.split()[0]) for line in ran.read_text().splitlines()]
    assert numbers == list(range(11, kept["b"] + 1))  # it stopped at its new end
    messages = {line.split()[1] for line in ran.read_text().splitlines()}
    assert messages == {result.id}  # from inside the message of three
