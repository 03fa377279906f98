"""The backlog caps (DTASK_MAX_BACKLOG per queue, DTASK_MAX_CLIENT_BACKLOG per client) against
a real PostgreSQL: a submit past one is refused at once with ``busy`` and creates nothing; a
bulk submit's runs past it get the outcome ``busy``; room comes back as runs finish; a full
queue refuses the clients that hold their share of it, never one below its share."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.client.clients import set_client
from tests.conftest import DTASK, REPO
from tests.support.db import wait_for


@pytest.fixture
def capped(settings_from: Callable[[dict[str, str]], None]) -> None:
    settings_from({"DTASK_MAX_BACKLOG": "3", "DTASK_MAX_CLIENT_BACKLOG": "4"})


def queue() -> str:
    return f"bq{uuid.uuid4().hex[:8]}"


def count(queue: str) -> int:
    with services.store().db.tx() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM dtask_runs WHERE queue LIKE :q"), {"q": f"{queue}%"}
            ).scalar_one()
        )


def new_client(**settings: object) -> str:
    set_client(name := f"c{uuid.uuid4().hex[:8]}", **settings)  # type: ignore[arg-type]
    return name


def submit(queue: str, client: str) -> dtask.Run:
    return dtask.submit("tagged", {"n": 1, "delay": 0}, queue=queue, client=client)


def test_a_queue_at_its_cap_refuses_at_once_and_creates_nothing(capped: None) -> None:
    q, client = queue(), new_client()
    runs = [submit(q, client) for _ in range(3)]
    with pytest.raises(dtask.Busy, match=rf"^busy: queue '{q}' holds 3 unfinished runs") as busy:
        submit(q, client)
    assert busy.value.retry_after > 0 and busy.value.exit_code == 4
    assert f"client '{client}' holds 3 of them" in str(busy.value)
    assert count(q) == 3
    premium, rich = queue(), new_client(tier="premium")
    dtask.submit("tagged", {"n": 1, "delay": 0}, queue=premium, client=rich, tier="premium")
    other = new_client()
    submit(premium, other)  # its tiers' queues count as the queue's: two of three
    submit(premium, other)
    with pytest.raises(dtask.Busy):
        submit(premium, other)
    assert count(premium) == 3
    runs[0].cancel()  # a finished run makes room, seen within a second
    wait_for(lambda: _accepted(q, client), 30, "the cancelled run's room")
    assert count(q) == 4  # the cancelled one and three unfinished


def _accepted(q: str, client: str) -> bool:
    try:
        submit(q, client)
    except dtask.Busy:
        return False
    return True


def test_one_client_filling_a_queue_leaves_every_other_client_its_share(capped: None) -> None:
    """Issue 58, item 12: the queue's cap is shared fairly. The client that filled the queue
    is the one told busy; each other client still gets its share of the cap (divided among
    the clients holding runs in the queue, at least one run), so the queue may pass its cap,
    by those shares, never past twice it."""
    q, filler = queue(), new_client()
    for _ in range(3):
        submit(q, filler)
    second = new_client()
    submit(q, second)  # half of the cap is its share: one run
    with pytest.raises(dtask.Busy, match=f"client '{filler}' holds 3 of them"):
        submit(q, filler)
    with pytest.raises(dtask.Busy, match=f"client '{second}' holds 1 of them"):
        submit(q, second)
    found = dtask.submit_many("tagged", [{"n": 1, "delay": 0}] * 3, queue=q, client=new_client())
    assert [s.outcome.value for s in found] == ["created", "busy", "busy"]
    assert count(q) == 5
    submit(q, new_client())  # a fourth client's share: one run, the queue at twice its cap
    with pytest.raises(dtask.Busy, match=rf"^busy: queue '{q}' holds 6 unfinished runs, twice"):
        submit(q, new_client())
    assert count(q) == 6


def test_a_client_at_its_cap_is_refused_whatever_the_queue(capped: None) -> None:
    client = new_client()
    for _ in range(2):
        submit(queue(), client)
        submit(queue(), client)
    with pytest.raises(dtask.Busy, match=f"client '{client}' has 4 unfinished runs"):
        submit(queue(), client)
    submit(queue(), new_client())  # another client is not held back


def test_a_bulk_past_the_cap_creates_what_fits_and_says_busy(capped: None) -> None:
    q = queue()
    found = dtask.submit_many(
        "tagged", [{"n": 1, "delay": 0}, {"n": "x"}, *[{"n": 1, "delay": 0}] * 4], queue=q,
        client=new_client(),
    )  # fmt: skip
    assert [s.outcome.value for s in found] == [
        "created", "invalid", "created", "created", "busy", "busy",
    ]  # fmt: skip
    assert found[4].retry_after and "busy: queue" in (found[4].error or "")
    assert count(q) == 3


def test_a_known_key_at_the_cap_answers_with_its_run(capped: None) -> None:
    """A retried submit (its key already triggered) gets its run, not busy: exactly once per
    key holds whatever the backlog; a key that asks for other variables is still refused."""
    q, client = queue(), new_client()
    first = dtask.submit("tagged", {"n": 1, "delay": 0}, key="k1", queue=q, client=client)
    submit(q, client)
    submit(q, client)
    again = dtask.submit("tagged", {"n": 1, "delay": 0}, key="k1", queue=q, client=client)
    assert (again.id, again.created) == (first.id, False)
    with pytest.raises(dtask.KeyConflict):
        dtask.submit("tagged", {"n": 2, "delay": 0}, key="k1", queue=q, client=client)
    with pytest.raises(dtask.Busy):
        dtask.submit("tagged", {"n": 1, "delay": 0}, key="k2", queue=q, client=client)
    found = dtask.submit_many(
        "tagged", [{"n": 1, "delay": 0}] * 2, keys=["k1", "k3"], queue=q, client=client
    )
    assert [(s.outcome.value, s.run_id) for s in found] == [
        ("known_key", first.id), ("busy", None),
    ]  # fmt: skip
    assert count(q) == 3


def test_the_cli_says_busy_and_exits_4(capped: None) -> None:
    client = new_client()
    submit(queue(), client)
    done = subprocess.run(
        [DTASK, "submit", "tagged", "--var", "n=1", "--var", "delay=0", "--client", client],
        env={**os.environ, "DTASK_MAX_CLIENT_BACKLOG": "1"}, cwd=REPO, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith(f"dtask: error: busy: client '{client}' has 1 unfinished run (")
    assert done.stdout == ""


@pytest.mark.parametrize("clients", [1, 10], ids=["one client", "ten clients"])
def test_concurrent_bulk_submits_in_one_process_never_pass_the_cap(
    settings_from: Callable[[dict[str, str]], None], clients: int
) -> None:
    """Security review: ten threads of one process (as ``dtask serve`` answers ten parallel
    ``POST /api/v1/runs/batch``) each submitting 100 runs to a queue capped at 100, no worker
    running. Each submit reserves what it admits in the process's cached counts, so within
    one process the queue never passes its cap by more than one submit: one client gets
    exactly the cap, and ten clients (each below its share) never more than twice it."""
    settings_from({"DTASK_MAX_BACKLOG": "100"})
    q, names = queue(), [new_client() for _ in range(clients)]
    start, outcomes = threading.Barrier(10), [list[str]() for _ in range(10)]

    def bulk(i: int) -> None:
        start.wait()
        found = dtask.submit_many(
            "tagged", [{"n": 1, "delay": 0}] * 100, queue=q, client=names[i % clients]
        )
        outcomes[i] = [s.outcome.value for s in found]

    threads = [threading.Thread(target=bulk, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    created = sum(o.count("created") for o in outcomes)
    assert {v for o in outcomes for v in o} <= {"created", "busy"} and all(outcomes)
    assert count(q) == created
    assert (created == 100) if clients == 1 else (100 <= created <= 200), created
