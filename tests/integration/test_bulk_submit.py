"""``dtask.submit_many`` against a real PostgreSQL (and the session's broker): each item's
outcome in input order, one run per client key, rate limits counting every run (exact with
other submitters racing), chunks of one transaction, and a bad option that writes nothing."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.client.clients import set_client
from dtask.domain.bulk import MOST_PER_CHUNK, Outcome, Submitted


@pytest.fixture(autouse=True)
def env(dtask_env: dict[str, str]) -> dict[str, str]:
    return dtask_env


def new_client(**settings: object) -> str:
    name = f"b{uuid.uuid4().hex[:10]}"
    set_client(name, **settings)  # type: ignore[arg-type]
    return name


def runs_of(client: str) -> dict[str, tuple[int, dict[str, object]]]:
    with services.store().db.tx() as conn:
        rows = conn.execute(
            text("SELECT trigger_key, id, variables FROM dtask_runs WHERE client = :c"),
            {"c": client},
        ).all()
    return {str(r.trigger_key): (int(r.id), dict(r.variables)) for r in rows}


def outcomes(found: list[Submitted]) -> list[str]:
    return [s.outcome.value for s in found]


def test_each_item_gets_its_outcome_in_input_order() -> None:
    client = new_client()
    known = dtask.submit("tagged", {"n": 1, "delay": 0}, key="k-old", client=client)
    found = dtask.submit_many(
        "tagged",
        [
            {"n": 1, "delay": 0},  # a new key
            {"n": "many", "delay": 0},  # not an int
            {"n": 1, "delay": 0},  # k-old's variables: its run
            {"n": 2, "delay": 0},  # k-old with other variables: refused
            {"n": 3, "delay": 0},  # the same key as item 0, other variables
            {"n": 1, "delay": 0},  # the same key as item 0 and its variables
            {"n": 4, "delay": 0, "extra": 1},  # a variable the template lacks
            {"n": 5, "delay": 0},  # a fresh key
        ],
        keys=["k-a", "k-b", "k-old", "k-old", "k-a", "k-a", "k-c", None],
        client=client,
    )
    assert [s.index for s in found] == list(range(8))
    assert outcomes(found) == [
        "created", "invalid", "known_key", "invalid", "invalid", "known_key", "invalid", "created",
    ]  # fmt: skip
    assert found[2].run_id == known.id and found[5].run_id == found[0].run_id
    assert "'n'" in (found[1].error or "")
    assert "already triggered run" in (found[3].error or "")
    assert "already triggered run" in (found[4].error or "")
    stored = runs_of(client)
    assert set(stored) == {"k-old", "k-a", found_key(found[7])}
    assert stored["k-a"] == (found[0].run_id, {"n": 1, "delay": 0.0})


def found_key(item: Submitted) -> str:
    assert item.run_id is not None
    return services.store().runs.get(item.run_id).key


def test_rate_limits_count_every_run_of_a_bulk_in_order() -> None:
    client = new_client(rate="5/m")
    found = dtask.submit_many("tagged", [{"n": 1, "delay": 0}] * 8, client=client)
    assert outcomes(found) == ["created"] * 5 + ["limit_exceeded"] * 3
    assert all(s.retry_after is not None and 0 < s.retry_after <= 60 for s in found[5:])
    assert "limit exceeded" in (found[7].error or "")
    with pytest.raises(dtask.RateLimited):
        dtask.submit("tagged", {"n": 1, "delay": 0}, client=client)
    children = new_client(child_rate="10/m")
    found = dtask.submit_many(
        "tagged", [{"n": n, "delay": 0} for n in (4, 4, 3, 2)], client=children
    )  # each run weighs its children: 4 + 4 fit, 3 does not, 2 does
    assert outcomes(found) == ["created", "created", "limit_exceeded", "created"]


def test_a_limit_is_exact_with_bulk_and_single_submitters_racing() -> None:
    client = new_client(rate="30/m")
    created: list[int] = []
    lock = threading.Lock()

    def bulk() -> None:
        found = dtask.submit_many("tagged", [{"n": 1, "delay": 0}] * 10, client=client)
        with lock:
            created.extend(s.run_id for s in found if s.outcome is Outcome.CREATED and s.run_id)

    def single() -> None:
        for _ in range(10):
            try:
                run = dtask.submit("tagged", {"n": 1, "delay": 0}, client=client)
            except dtask.RateLimited:
                continue
            with lock:
                created.append(run.id)

    threads = [threading.Thread(target=f) for f in (bulk, bulk, bulk, single, single)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(created) == 30 == len(set(created)) == len(runs_of(client))


def test_chunks_each_a_transaction_with_progress() -> None:
    client = new_client()
    done: list[int] = []
    total = MOST_PER_CHUNK * 2 + 5
    found = dtask.submit_many(
        "tagged", ({"n": 1, "delay": 0} for _ in range(total)), client=client,
        on_progress=done.append,
    )  # fmt: skip
    assert done == [MOST_PER_CHUNK, MOST_PER_CHUNK * 2, total]
    assert outcomes(found) == ["created"] * total
    assert len(runs_of(client)) == total
    again = dtask.submit_many("tagged", [{"n": 1, "delay": 0}] * 3, client=client,
                              keys=[found_key(found[i]) for i in (0, 1500, total - 1)])  # fmt: skip
    assert outcomes(again) == ["known_key"] * 3


def test_a_bad_option_refuses_the_whole_call_and_writes_nothing() -> None:
    missing = f"nobody-{uuid.uuid4().hex[:8]}"
    with pytest.raises(dtask.ClientNotFound):
        dtask.submit_many("tagged", [{"n": 1, "delay": 0}], client=missing)
    client = new_client()
    with pytest.raises(dtask.InvalidDelayTolerance):
        dtask.submit_many("tagged", [{"n": 1, "delay": 0}], client=client, delay_tolerance=1e12)
    with pytest.raises(dtask.UnknownTemplate):
        dtask.submit_many("no-such-template", [{"n": 1}], client=client)
    with pytest.raises(dtask.InvalidVariables, match="2 keys for 1 items"):
        dtask.submit_many("tagged", [{"n": 1, "delay": 0}], keys=["a", "b"], client=client)
    assert runs_of(client) == {} and runs_of(missing) == {}


def test_template_map_and_upstreams() -> None:
    client = new_client()
    first = dtask.submit("tagged", {"n": 1, "delay": 0}, client=client)
    found = dtask.registry.get("tagged").map(
        [{"n": 1, "delay": 0}, {"n": 2, "delay": 0}], client=client, after=[first.id]
    )
    assert outcomes(found) == ["created", "created"]
    for item in found:
        assert item.run_id is not None
        assert dtask.get_run(item.run_id).status().waiting_for == (first.id,)
