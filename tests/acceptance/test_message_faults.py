"""A worker killed, or paused past its lease, in the middle of messages of short children
(dtask.children, up to MAX_BATCH each), on both brokers: every child ends succeeded once in
PostgreSQL, the run's counts are its children's, and a paused worker that wakes writes
nothing over what another did. The store's rules are tests/contract/test_message_claim.py;
these are the same with real processes, to hold before and after one claim covers a message
(docs/design/message-claims.md)."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.domain.dispatch import MAX_BATCH
from tests.acceptance.test_batches import written
from tests.acceptance.test_faults import Cluster, broker_env, cluster
from tests.support.db import owner_pid, wait_for

pytestmark = pytest.mark.acceptance
__all__ = ["broker_env", "cluster"]  # both brokers, the fault tests' 3-s leases

N = 12_000


def succeeded(run_id: int) -> int:
    return dtask.get_run(run_id).status().children.succeeded


def settled(log: str) -> bool:
    """Every dtask.children message the worker received has ended there (succeeded, raised,
    retried, ignored or rejected): what it held when it was paused has been written, or
    refused."""
    received = set(re.findall(r"Task dtask\.children\[([^\]]+)\] received", log))
    ended = set(re.findall(r"Task dtask\.children\[([^\]]+)\] (?!received)", log))
    return received <= ended


def running_owner(run_id: int) -> str | None:
    with services.store().engine.connect() as conn:
        owner: str | None = conn.execute(
            text(
                "SELECT owner FROM dtask_children WHERE run_id = :r AND state = 'running'"
                " AND owner IS NOT NULL UNION ALL SELECT owner FROM dtask_messages"
                " WHERE run_id = :r AND owner IS NOT NULL LIMIT 1"
            ),
            {"r": run_id},
        ).scalar()
    return owner


def rows(run_id: int) -> tuple[Counter[str], int, object]:
    """The run's children by state, their attempts in all, and the latest write to any."""
    with services.store().engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT state, count(*) AS n, sum(attempt) AS attempts, max(updated_at) AS at"
                " FROM dtask_children WHERE run_id = :r GROUP BY state"
            ),
            {"r": run_id},
        ).all()
    states = Counter({r.state: int(r.n) for r in found})
    return states, sum(int(r.attempts) for r in found), max(r.at for r in found)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "paused"])
def test_a_worker_lost_mid_message_leaves_every_child_succeeded_once(
    cluster: Cluster, sink: Path, how: signal.Signals
) -> None:
    run_id = cluster.submit("tiny", n=N, fail_every=0)
    wait_for(lambda: succeeded(run_id) >= N // 8, 120, f"{N // 8} children done")
    # a worker with a message in hand: one of its children is running now
    owner = wait_for(lambda: running_owner(run_id), 60, "a running child")
    lost = cluster.worker_of(owner_pid(owner))
    os.killpg(lost.proc.pid, how)
    try:
        status = dtask.get_run(run_id).wait(timeout=240)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        ended = rows(run_id)
    finally:
        if how is signal.SIGSTOP:
            os.killpg(lost.proc.pid, signal.SIGCONT)
    if how is signal.SIGSTOP:  # awake: its held successes and leases are another's now
        wait_for(lambda: settled(lost.output()), 120, "the paused worker's messages to end")
    after = dtask.get_run(run_id).status()
    assert after.finished_at == status.finished_at
    assert after.children.succeeded == N and after.children.failed == 0
    states, attempts, last_write = rows(run_id)
    assert states == Counter(succeeded=N)
    assert last_write == ended[2], "a child was written after its run had finished"
    # an attempt is spent only by a child whose start was written (taken before) or that
    # was running when its worker was lost: one per pool process of it at most
    assert N <= attempts <= N + 2, attempts
    seen = written(sink, run_id)
    assert set(seen) == set(range(N))
    # children a lost worker ran whose successes it had not written run again: at most its
    # two pool processes' messages
    assert sum(seen.values()) - N <= 2 * MAX_BATCH, seen.most_common(3)
