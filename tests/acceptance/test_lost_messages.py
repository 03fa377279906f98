"""Lost messages with real workers, on Redis and on RabbitMQ (issue 15): a child's message
lost while the queue never empties (hole 4); a master's, for a run whose split outlasts the
reaper's turn (hole 12)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.db.database import RUN_LOCKS
from dtask.domain.runs import NewRun
from tests.acceptance.test_faults import (
    FAST,
    Cluster,
    assert_resumed,
    broker_env,
    cluster,
    running_with_checkpoint,
)
from tests.conftest import REPO
from tests.support.broker import waiting
from tests.support.db import children, wait_for
from tests.support.pauses import pause_after

pytestmark = pytest.mark.acceptance
__all__ = ["broker_env", "cluster"]  # the fault tests' fixtures: both brokers, two workers

STALL = float(FAST["DTASK_STALL_TIMEOUT"])
LEASE = float(FAST["DTASK_LEASE_TTL"])
BACKLOG_CHILD = 8.0  # seconds each of the backlog's four children holds a pool process


def broker_tool(cluster: Cluster, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.broker", *args],
        env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def load(cluster: Cluster) -> Iterator[subprocess.Popen[bytes]]:
    """Keeps at least 8 messages waiting in the queue until the test ends."""
    busy = subprocess.Popen(
        [sys.executable, "-m", "tests.support.broker", "busy", "8"], env=cluster.env, cwd=REPO
    )
    try:
        yield busy
    finally:
        busy.kill()
        busy.wait(10)
        store = services.store()
        unfinished = "SELECT id FROM dtask_runs WHERE state IN ('pending', 'splitting', 'running')"
        with store.engine.connect() as conn:
            live = conn.execute(text(unfinished)).scalars().all()
        for run_id in live:  # one run per transaction, as a user's cancels: a bulk UPDATE
            store.runs.cancel(run_id)  # deadlocked with a worker finishing two of them
        broker_tool(cluster, "purge")


def test_a_lost_message_runs_within_the_stall_bound_while_the_queue_never_empties(
    cluster: Cluster, load: subprocess.Popen[bytes]
) -> None:
    delay = BACKLOG_CHILD / 20
    backlog = cluster.submit("slow_range", n=80, delay=delay)  # four children, one per process
    wait_for(lambda: [s for _, s, _ in children(backlog)] == ["running"] * 4, 60, "a full cluster")
    lost = int(broker_tool(cluster, "lose", "20", "0.01"))  # nobody could take it meanwhile
    deleted = time.monotonic()
    # the backlog holds every process for up to BACKLOG_CHILD s; the message is missed within
    # 1.5 stall timeouts (overdue after one, looked for every half); the rest is slack
    bound = BACKLOG_CHILD + 3 * STALL + 5
    busy: list[bool] = []  # sampled while the lost child waits: was the queue still busy?
    status = dtask.get_run(lost).wait(
        timeout=bound, poll=0.2, on_progress=lambda s: busy.append(waiting() > 1)
    )
    took = time.monotonic() - deleted
    assert status.state is dtask.RunState.SUCCEEDED, f"not run after {took:.1f} s: {status}"
    assert cluster.sink_numbers(lost, 0) == list(range(1, 21))
    # most of the wait, other children waited too (a busy machine may starve the load briefly)
    assert sum(busy) >= 0.8 * len(busy), f"the queue was empty in {busy.count(False)} samples"
    assert load.poll() is None
    print(f"lost child ran {took:.1f} s after its message was deleted (bound {bound:g} s)")


def test_a_split_longer_than_the_lease_runs_on_a_worker_while_failover_goes_on(
    cluster: Cluster,
) -> None:
    store = services.store()
    split_for = 3 * LEASE
    variables = {"n": 30, "seconds": split_for}
    stuck, _ = store.runs.create(NewRun("long_split", f"lost:{uuid.uuid4()}", variables, 3, None))
    # its master message is lost: the reaper re-sends it after a stall timeout
    other = cluster.submit("slow_range", n=40, delay=0.4)
    pid = wait_for(lambda: running_with_checkpoint(other, 0, 5), 30, "child 0 to checkpoint")
    wait_for(lambda: _splitting(stuck), 4 * STALL, "the stuck run's split to start")
    os.kill(pid, signal.SIGKILL)  # while the long split runs
    killed = time.monotonic()
    wait_for(lambda: running_with_checkpoint(other, 0, 1) not in (None, pid), 30, "failover")
    took = time.monotonic() - killed
    assert took < LEASE + 3, f"failover took {took:.1f} s during the split"
    for run_id, children_ in ((stuck, 3), (other, 2)):
        status = dtask.get_run(run_id).wait(timeout=60)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        assert status.children.total == children_
    assert sorted(n for i in range(3) for n in cluster.sink_numbers(stuck, i)) == list(range(1, 31))
    assert_resumed(cluster, other, 0, 1, 20, done=5)  # it had checkpointed 5 when killed
    assert "the reaper's turn ended" not in cluster.output()
    print(f"failover {took:.1f} s after the kill, during a {split_for:g} s split")


def _splitting(run_id: int) -> bool:
    """True while some session holds the run's lock (its split is under way)."""
    with services.store().engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND classid = :ns AND objid = :run"
                ),
                {"ns": RUN_LOCKS, "run": run_id},
            ).scalar_one()
        )


def lose_everything(cluster: Cluster) -> None:
    """The broker loses every message: Redis FLUSHALL; RabbitMQ's queue deleted."""
    broker = cluster.env.get("DTASK_BROKER_URL")
    if broker is None:  # the embedded Redis
        import redis

        from dtask.services import embedded

        redis.Redis(unix_socket_path=str(embedded.redis_socket(cluster.home))).flushall()
        return
    from kombu import Connection

    with Connection(broker) as conn:
        conn.channel().queue_delete("dtask")


def test_the_broker_losing_every_message_mid_run_costs_time_not_work(cluster: Cluster) -> None:
    """Every message gone mid-run (the queue, the chord's counts on Redis): the reaper re-sends
    the children PostgreSQL says are overdue, within 1.5 stall timeouts, each runs once, the
    run finishes, and a ``messages_lost`` alert names the queue."""
    n = 200
    run_id = cluster.submit("tagged", n=n, delay=0.05)
    wait_for(
        lambda: sum(s == "succeeded" for _, s, _ in children(run_id)) >= n // 4, 60, "a quarter"
    )
    lost = time.time()
    lose_everything(cluster)
    status = dtask.get_run(run_id).wait(timeout=90)
    took = time.time() - lost
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    rows = children(run_id)
    assert [s for _, s, _ in rows] == ["succeeded"] * n
    assert len(list(cluster.sink.glob(f"{run_id}-*.txt"))) == n
    redone = sum(1 for _, _, attempt in rows if attempt > 1)
    _, resumed = pause_after(cluster.sink, run_id, lost)
    print(
        f"\nevery message lost: children started again {resumed:.1f} s later, the run finished"
        f" {took:.1f} s later, {redone} children redone"
    )
    assert redone == 0
    alert = wait_for(  # its queue's: another test's queue may have lost messages too
        lambda: [
            a for a in services.store().alerts.open()
            if a.kind == "messages_lost" and a.subject == "dtask"
        ],
        30, "the messages_lost alert of queue 'dtask'",
    )  # fmt: skip
    assert "were neither in the broker" in alert[0].message
