"""A run's kept Celery chains (dtask_runs.chains) against a real PostgreSQL: added under the
run's lock, handed out once the run has finished, exactly once however many ask at once, and
kept when sending them fails."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

from dtask import services
from dtask.db import Store
from dtask.db.runs import Chained
from dtask.domain.runs import NewRun, RunState


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def new_run(store: Store) -> int:
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    return run_id


def test_chains_wait_for_the_run_and_go_once(store: Store) -> None:
    run_id = new_run(store)
    assert store.runs.add_chain(run_id, {"id": "a", "chain": [{"task": "x"}]}) is RunState.PENDING
    assert store.runs.add_chain(run_id, {"id": "b", "errbacks": [{"task": "e"}]}).finished is False
    assert store.runs.get(run_id).chained
    sent: list[Chained] = []
    assert store.runs.take_chains(run_id, sent.append) is False  # not finished: they wait
    assert run_id not in store.runs.chained_finished(settled_for=0)
    assert store.runs.cancel(run_id) is RunState.CANCELLED
    assert run_id in store.runs.chained_finished(settled_for=0)
    assert run_id not in store.runs.chained_finished(settled_for=3600)

    def broken(chained: Chained) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        store.runs.take_chains(run_id, broken)
    assert store.runs.get(run_id).chained, "kept for a later try"
    assert store.runs.take_chains(run_id, sent.append) is True
    assert [(c.state, [k["id"] for k in c.chains]) for c in sent] == [
        (RunState.CANCELLED, ["a", "b"])
    ]
    assert store.runs.take_chains(run_id, sent.append) is False
    assert len(sent) == 1 and not store.runs.get(run_id).chained
    assert run_id not in store.runs.chained_finished(settled_for=0)


def test_many_takers_at_once_send_once(store: Store) -> None:
    run_id = new_run(store)
    store.runs.add_chain(run_id, {"id": "a"})
    store.runs.cancel(run_id)
    sent: list[Any] = []
    start = threading.Barrier(4)

    def take() -> None:
        start.wait()
        store.runs.take_chains(run_id, sent.append)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(sent) == 1


def test_a_chain_added_to_a_finished_run_is_the_adders_to_send(store: Store) -> None:
    run_id = new_run(store)
    store.runs.cancel(run_id)
    assert store.runs.add_chain(run_id, {"id": "late"}) is RunState.CANCELLED
    sent: list[Chained] = []
    assert store.runs.take_chains(run_id, sent.append)
    assert [k["id"] for k in sent[0].chains] == ["late"]
