"""The reaper's pass is bounded: it runs no user code, and re-sends lost messages in bounded
batches whatever the broker's queue holds (real PostgreSQL and Redis, no worker)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

from dtask import services
from dtask.db import Claim, Store
from dtask.db.recovery import MASTERS_WHILE_MOVING
from dtask.domain.runs import NewRun, RunState
from dtask.worker import configure
from dtask.worker.app import app
from dtask.worker.messages import send_chord
from dtask.worker.reaper import queue_size
from tests.integration.test_reaper import expire_lease_of_child_0, lead_a_pass, new_run, running_run
from tests.integration.test_reaper import sql as run_sql
from tests.support.db import child_row


@pytest.fixture
def store(dtask_env: dict[str, str]) -> Iterator[Store]:
    configure()
    yield services.store()


@pytest.fixture
def short_lease(dtask_env: dict[str, str]) -> Iterator[Store]:
    """A one-second lease: the reaper's turn ends after one second idle."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DTASK_LEASE_TTL", "1")
        env.setenv("DTASK_HEARTBEAT_INTERVAL", "0.2")
        services.reset()
        configure()
        yield services.store()
    assert "DTASK_LEASE_TTL" not in os.environ
    services.reset()
    configure()


def test_a_split_longer_than_the_lease_does_not_cost_the_reaper_its_turn(
    short_lease: Store,
) -> None:
    store = short_lease
    slow = new_run(store, "slow_split", {"n": 20})  # its split sleeps 2 s: twice the lease
    run_sql("UPDATE dtask_runs SET updated_at = now() - interval '1 hour' WHERE id = :r", r=slow)
    other = running_run(store)
    expire_lease_of_child_0(store, other)
    started = time.monotonic()
    done = lead_a_pass()  # before: the pass split inline, lost its turn and raised LeaseLost
    assert time.monotonic() - started < 1.0
    assert done.unstuck >= 1 and done.expired >= 1
    assert child_row(other, 0).state == "pending"  # other recovery went on in the same pass
    assert store.runs.status(slow).state is RunState.PENDING  # split by a worker's master task


def purge(queue: str) -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)


def test_lost_messages_are_re_sent_whatever_the_queue_holds_in_bounded_batches(
    store: Store,
) -> None:
    queue = f"lost-{uuid.uuid4().hex[:8]}"
    run_id, _ = store.runs.create(
        NewRun("print_range", f"test:{uuid.uuid4()}", {"n": 300}, 3, queue)
    )
    store.runs.split(run_id, lambda run, slots: [{"a": i, "b": i} for i in range(300)])
    store.runs.dispatch(run_id, send_chord)
    assert queue_size(queue) == 300  # a backlog: every message waits in the queue
    run_sql(
        "UPDATE dtask_children SET sent_at = sent_at - interval '1 hour' WHERE run_id = :r",
        r=run_id,
    )
    lead_a_pass()
    assert queue_size(queue) == 300  # nobody consumes this queue: copies would only pile up
    assert isinstance(store.children.claim(run_id, 299, "me:1", 30), Claim)  # now it moves
    # the broker cannot say which are missing: the 100 (DTASK_RESEND_BATCH) oldest are re-sent
    lead_a_pass()
    assert queue_size(queue) == 400
    lead_a_pass()
    assert queue_size(queue) == 500  # each pass at most one batch (passes are 1/2 stall apart)
    purge(queue)  # the broker lost everything: at least 299 are missing, all overdue go now
    lead_a_pass()
    assert queue_size(queue) == 99
    lead_a_pass()
    assert queue_size(queue) == 99  # each child at most once per stall timeout


def test_masters_queued_behind_moving_ones_are_not_re_sent_but_a_lost_one_is(
    store: Store,
) -> None:
    """A burst of submits queues masters behind a backlog: while masters move, a pass re-sends
    only runs older than one that started (overtaken: lost), a few of the oldest a pass; when
    nothing moves every stuck run's master is re-sent."""
    stall = 1.0
    lost = [new_run(store, "print_range", {"n": 1}) for _ in range(3 * MASTERS_WHILE_MOVING)]
    running_run(store)  # a master took a run submitted after those just now: masters move
    queued = [new_run(store, "print_range", {"n": 1}) for _ in range(5)]
    run_sql(
        "UPDATE dtask_runs SET updated_at = now() - interval '1 hour' WHERE id = ANY(:ids)",
        ids=lost + queued,
    )  # waiting for a master for an hour
    first = store.recovery.take_stuck(stall)
    assert 0 < len(first) <= MASTERS_WHILE_MOVING  # before: all 35 (and earlier tests' runs)
    # oldest first, each at most once per stall: the newest lost one comes in turn
    taken = [run_id for run_id, _ in first]
    for _ in range(10_000):
        more = store.recovery.take_stuck(stall)
        assert len(more) <= MASTERS_WHILE_MOVING
        taken += [run_id for run_id, _ in more]
        if not more:
            break
    assert set(lost) <= set(taken)
    assert not set(queued) & set(taken)  # behind the queue's front: still queued
    time.sleep(stall + 0.2)  # nothing moved for a stall timeout: no worker takes masters
    run_sql("UPDATE dtask_runs SET master_sent_at = NULL WHERE id = ANY(:ids)", ids=lost)
    stuck = {run_id for run_id, _ in store.recovery.take_stuck(stall, limit=100_000)}
    assert set(lost + queued) <= stuck
