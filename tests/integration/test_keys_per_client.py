"""Trigger keys belong to clients, against a real PostgreSQL: one key under two clients is two
runs, under one client one run (on the full path, the one-statement path and racing), a key
is resolved within its client, and a schedule's slot runs once whoever else used its key."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from dtask import services
from dtask.client.clients import set_client
from dtask.db import Store
from dtask.db.run_inserts import Created
from dtask.db.schedules import Firing
from dtask.domain.clients import DEFAULT_CLIENT, Client
from dtask.domain.runs import NewRun
from dtask.domain.schedules import Schedule, Timing, trigger_key
from dtask.exceptions import KeyConflict, UpstreamNotFound


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def new_client() -> str:
    name = f"k{uuid.uuid4().hex[:10]}"
    set_client(name)
    return name


def new_key() -> str:
    return f"test:{uuid.uuid4()}"


def test_one_key_under_two_clients_is_two_runs_and_one_run_per_client(store: Store) -> None:
    a, b, c = new_client(), new_client(), new_client()
    key = new_key()
    mine = store.runs.create_run(NewRun("t", key, {"n": 1}, 3, None, client=a))
    again = store.runs.create_run(NewRun("t", key, {"n": 1}, 3, None, client=a))
    # another client's variables under the same key: its own run, no KeyConflict naming a's
    theirs = store.runs.create_run(NewRun("t", key, {"n": 2}, 3, None, client=b))
    assert mine.created and (again.id, again.created) == (mine.id, False)
    assert theirs.created and theirs.id != mine.id
    assert store.runs.status(mine.id).client == a and store.runs.status(theirs.id).client == b
    with pytest.raises(KeyConflict) as conflict:  # within a client a key still means one run
        store.runs.create_run(NewRun("t", key, {"n": 3}, 3, None, client=b))
    assert f"triggered run {theirs.id} with" in str(conflict.value)  # b's run, never a's

    assert store.runs.ids_by_key([key], client=a) == {key: mine.id}
    assert store.runs.ids_by_key([key], client=b) == {key: theirs.id}
    with pytest.raises(UpstreamNotFound):  # c has no run of that key: a's and b's do not count
        store.runs.ids_by_key([key], client=c)


def test_the_one_statement_submit_keeps_keys_per_client(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = new_client(), new_client()
    for client in (a, b):  # each read once, without limits: its next submits are one statement
        store.runs.create_run(NewRun("t", new_key(), {}, 3, None, client=client))
    taken: list[tuple[str, Created | None]] = []
    one_statement = store.runs._insert_unlimited

    def spy(run: NewRun, client: Client) -> Created | None:
        got = one_statement(run, client)
        taken.append((run.client, got))
        return got

    monkeypatch.setattr(store.runs, "_insert_unlimited", spy)
    key = new_key()
    mine = store.runs.create_run(NewRun("t", key, {}, 3, None, client=a))
    theirs = store.runs.create_run(NewRun("t", key, {}, 3, None, client=b))
    again = store.runs.create_run(NewRun("t", key, {}, 3, None, client=a))
    assert [(client, got is not None) for client, got in taken] == [
        (a, True),  # inserted by the one statement
        (b, True),  # a's key does not stop b's insert
        (a, False),  # a's own key does: the full path answers with a's run
    ]
    assert mine.created and theirs.created and theirs.id != mine.id
    assert (again.id, again.created) == (mine.id, False)


def test_racing_submits_of_one_key_by_two_clients_create_one_run_each(store: Store) -> None:
    a, b = new_client(), new_client()
    store.runs.create_run(NewRun("t", new_key(), {}, 3, None, client=a))  # a remembered, b not
    key = new_key()
    results: list[tuple[str, int, bool]] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def submit(client: str) -> None:
        start.wait(30)
        run_id, created = store.runs.create(NewRun("t", key, {}, 3, None, client=client))
        with lock:
            results.append((client, run_id, created))

    threads = [threading.Thread(target=submit, args=(c,)) for c in (a, b) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = {client: {run_id for c, run_id, _ in results if c == client} for client in (a, b)}
    assert len(ids[a]) == 1 and len(ids[b]) == 1 and ids[a] != ids[b]
    assert sorted(c for c, _, created in results if created) == sorted([a, b])


def test_a_schedule_s_slot_runs_once_for_its_client_whoever_else_used_its_key(
    store: Store,
) -> None:
    schedules = store.schedules
    name = f"it-{uuid.uuid4().hex[:8]}"
    schedules.save(Schedule(name, "print_range", {"n": 1}, Timing(3600)), replace=False)
    slot = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
    key = trigger_key(name, slot)
    other = new_client()
    # the key taken by another client's run first (a submit refuses `schedule:` keys; the
    # store does not)
    squatter = store.runs.create_run(NewRun("t", key, {}, 3, None, client=other)).id

    def fire(schedule: Schedule, now: datetime, previous_running: bool) -> Firing:
        assert schedule.decided_until is not None
        if schedule.name != name:
            return Firing([], schedule.decided_until, schedule.buffered, changed=False)
        run = NewRun("print_range", key, {"n": 1}, 1, None, name, slot).charged_to(
            Client(DEFAULT_CLIENT)
        )
        return Firing([run], schedule.decided_until, None, due_at=now)  # due again at once

    try:
        first = schedules.beat_pass(fire, hold_for=10)
        second = schedules.beat_pass(fire, hold_for=10)
        (created,) = [run_id for run_id, run in first.created if run.schedule == name]
        assert created != squatter
        assert [run_id for run_id, run in second.existing if run.schedule == name] == [created]
        assert not [run_id for run_id, run in second.created if run.schedule == name]
        with store.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, client FROM dtask_runs WHERE trigger_key = :k ORDER BY id"),
                {"k": key},
            ).all()
        assert [tuple(r) for r in rows] == [(squatter, other), (created, DEFAULT_CLIENT)]
        assert schedules.get(name).last_run_id == created
    finally:
        schedules.remove(name)
