"""A child whose message the broker lost runs although the queue never empties (issue 15,
hole 4): real workers, on Redis and on RabbitMQ."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.acceptance.test_faults import FAST, Cluster, broker_env, cluster
from tests.conftest import REPO
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance
__all__ = ["broker_env", "cluster"]  # the fault tests' fixtures: both brokers, two workers

STALL = float(FAST["DTASK_STALL_TIMEOUT"])
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
        with services.store().engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE dtask_runs SET state = 'cancelled', finished_at = now()"
                    " WHERE state IN ('pending', 'splitting', 'running')"
                )
            )
        broker_tool(cluster, "purge")


def waiting_children() -> int:
    with services.store().engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
                    " WHERE c.state = 'pending' AND r.state = 'running'"
                )
            ).scalar_one()
        )


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
    status = dtask.get_run(lost).wait(timeout=bound)
    took = time.monotonic() - deleted
    assert status.state is dtask.RunState.SUCCEEDED, f"not run after {took:.1f} s: {status}"
    assert cluster.sink_numbers(lost, 0) == list(range(1, 21))
    assert waiting_children() > 0, "the queue emptied: this did not test a busy queue"
    assert load.poll() is None
    print(f"lost child ran {took:.1f} s after its message was deleted (bound {bound:g} s)")
