"""Clients and rate limits against a real PostgreSQL: exact under concurrent submits, a known
key costs nothing, child rates charge what a run weighs."""

from __future__ import annotations

import threading
import uuid

import pytest

from dtask import services
from dtask.client.clients import get_client, list_clients, remove_client, set_client
from dtask.db import Claim, Store
from dtask.domain.clients import DEFAULT_CLIENT, Client
from dtask.domain.runs import NewRun, RunState
from dtask.exceptions import ClientNotFound, KeyConflict, RateLimited


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Store:
    return services.store()


def new_client(**settings: object) -> str:
    name = f"c{uuid.uuid4().hex[:10]}"
    set_client(name, **settings)  # type: ignore[arg-type]
    return name


def create(store: Store, client: str, key: str | None = None, children: int | None = 1) -> int:
    run_id, _ = store.runs.create(
        NewRun(
            "t",
            key or f"test:{uuid.uuid4()}",
            {},
            3,
            None,
            client=client,
            expected_children=children,
        )
    )
    return run_id


def test_concurrent_submits_get_exactly_the_limit(store: Store) -> None:
    client = new_client(rate="10/m")
    created: list[int] = []
    refused: list[RateLimited] = []
    lock = threading.Lock()

    def submit_five() -> None:
        for _ in range(5):
            try:
                run_id = create(store, client)
            except RateLimited as exc:
                with lock:
                    refused.append(exc)
            else:
                with lock:
                    created.append(run_id)

    threads = [threading.Thread(target=submit_five) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(created), len(refused)) == (10, 30)
    assert all("limit exceeded" in str(e) and 0 < e.retry_after <= 60 for e in refused)
    assert get_client(client).usage["runs_in_window"] == 10


def test_a_known_key_returns_its_run_and_costs_nothing(store: Store) -> None:
    client = new_client(rate="1/h")
    key = f"test:{uuid.uuid4()}"
    first = create(store, client, key)
    assert create(store, client, key) == first  # the limit is used up, the key still answers
    with pytest.raises(RateLimited):
        create(store, client)


def test_child_rates_charge_what_a_run_weighs(store: Store) -> None:
    client = new_client(child_rate="100/h")
    create(store, client, children=60)
    with pytest.raises(RateLimited, match=r"limit exceeded: client '\w+' may submit 100/h"):
        create(store, client, children=60)
    with pytest.raises(RateLimited, match="can never be accepted") as never:
        create(store, client, children=101)
    assert never.value.retry_after == float("inf")
    uncounted = create(store, client, children=None)  # a custom split: 1 until it splits
    assert get_client(client).usage["children_in_window"] == 61
    store.runs.split(uncounted, lambda run, slots: [{"i": i} for i in range(30)])
    assert get_client(client).usage["children_in_window"] == 90
    with pytest.raises(RateLimited):
        create(store, client, children=11)
    create(store, client, children=10)


def test_limits_change_live_and_priority_is_capped(store: Store) -> None:
    client = new_client(rate="1/h", max_priority=3)
    create(store, client)
    with pytest.raises(RateLimited):
        create(store, client)
    set_client(client, rate=None)
    run_id, _ = store.runs.create(
        NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None, client=client, priority=9)
    )
    status = store.runs.status(run_id)
    assert (status.client, status.priority) == (client, 3)
    assert next(s.id for s in store.runs.statuses(client=client)) == run_id


def test_unknown_clients_are_refused_and_default_always_exists(store: Store) -> None:
    with pytest.raises(ClientNotFound, match="create it with `dtask client set nobody`"):
        create(store, "nobody")
    assert "default" in [c.name for c in list_clients()]
    create(store, "default")
    client = new_client()
    remove_client(client)
    with pytest.raises(ClientNotFound):
        create(store, client)
    with pytest.raises(ClientNotFound):
        remove_client(client)


def test_runs_past_their_deadline_are_decided_once(store: Store) -> None:
    import time

    from dtask.domain.deadlines import OnLate
    from dtask.domain.runs import RunState

    def create_late(on_late: OnLate) -> int:
        run_id, _ = store.runs.create(
            NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None, delay_tolerance=0.2, on_late=on_late)
        )
        return run_id

    late_runs, late_fails = create_late(OnLate.RUN), create_late(OnLate.FAIL)
    on_time = create_late(OnLate.FAIL)
    store.runs.split(on_time, lambda run, slots: [{"i": 0}])
    store.runs.dispatch(on_time, lambda run, children: None)
    assert isinstance(store.children.claim(on_time, 0, "me", 30), Claim)  # starts in time
    time.sleep(0.3)
    decided = {late.run_id: late for late in store.recovery.take_late()}
    assert decided[late_runs].failed is False and decided[late_fails].failed is True
    assert on_time not in decided
    assert store.recovery.take_late() == []  # each run is decided once
    runs = {r: store.runs.status(r) for r in (late_runs, late_fails, on_time)}
    assert (runs[late_runs].state, runs[late_runs].late) == (RunState.PENDING, True)
    assert (runs[late_fails].state, runs[late_fails].late) == (RunState.FAILED, True)
    assert "not started within its delay tolerance of 0.2 s" in (runs[late_fails].error or "")
    assert (runs[on_time].state, runs[on_time].late) == (RunState.RUNNING, False)
    assert runs[on_time].as_json()["deadline"] is not None


def test_a_slot_run_s_deadline_counts_from_its_slot(store: Store) -> None:
    from datetime import UTC, datetime, timedelta

    from dtask.db.run_inserts import insert_run

    slot = datetime(2026, 1, 1, 3, 0, tzinfo=UTC)
    run = NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None, slot=slot, delay_tolerance=600)
    run = run.charged_to(Client(DEFAULT_CLIENT))
    with store.db.tx() as conn:
        created = insert_run(conn, run)
    assert created is not None
    assert store.runs.status(created.id).deadline == slot + timedelta(minutes=10)


def test_a_client_read_without_limits_is_checked_again_by_each_submit(store: Store) -> None:
    """A process remembers a client it found without rate limits and submits for it in one
    statement, which inserts only while the client's row still says so: a limit, a lower
    priority cap or its removal holds from the next submit on."""
    client = new_client(max_priority=7)
    create(store, client)  # read (and remembered) without limits
    create(store, client)  # one statement
    set_client(client, rate="3/h", max_priority=2)  # two used, one left
    capped = store.runs.create_run(
        NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None, client=client, priority=9)
    )
    assert store.runs.status(capped.id).priority == 2
    with pytest.raises(RateLimited):
        create(store, client)
    gone = new_client()
    create(store, gone)
    create(store, gone)
    remove_client(gone)
    with pytest.raises(ClientNotFound):
        create(store, gone)


def test_a_key_submitted_twice_in_one_statement_returns_the_same_run(store: Store) -> None:
    key = f"test:{uuid.uuid4()}"
    create(store, "default")  # the default client, remembered
    first = store.runs.create_run(NewRun("t", key, {"n": 1}, 3, None))
    again = store.runs.create_run(NewRun("t", key, {"n": 1}, 3, None))
    assert (first.created, again.created) == (True, False)
    assert again.id == first.id and again.state is first.state is RunState.PENDING
    with pytest.raises(KeyConflict, match="different variables"):
        store.runs.create_run(NewRun("t", key, {"n": 2}, 3, None))
    later = store.runs.create_run(NewRun("t", f"test:{uuid.uuid4()}", {}, 3, None, start_in=600))
    assert 590 < later.starts_in <= 600
