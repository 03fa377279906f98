"""A worker killed, or paused past its lease, in the middle of messages of short children
(dtask.children, up to MAX_BATCH each), on both brokers: every child ends succeeded once in
PostgreSQL, the run's counts are its children's, and a paused worker that wakes writes
nothing over what another did; a straggler in the middle of a message gives its rest away
from inside it, every number once. The store's rules are tests/contract/test_message_claim.py;
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
from tests.support.db import children, owner_pid, wait_for

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


CHILDREN, STRAGGLER = 2_000, 1_000  # children of ten numbers; the one of slow numbers


def written_by(sink: Path, run_id: int) -> tuple[Counter[int], dict[int, str]]:
    """How often each number was written, and the Celery message that last wrote each."""
    seen: Counter[int] = Counter()
    by: dict[int, str] = {}
    for line in (sink / f"{run_id}.straggler").read_text().splitlines():
        number, message = line.split()
        seen[int(number)] += 1
        by[int(number)] = message
    return seen, by


def test_a_straggler_in_the_middle_of_a_full_message_gives_its_rest_away_once(
    cluster: Cluster, sink: Path
) -> None:
    """A message of up to MAX_BATCH short children, claimed as one row, holds a straggler in its
    middle: once the run's other children are done, the dispatcher asks it for work, it cuts
    its range at its next checkpoint from inside the message, the new child runs in another
    message while the straggler goes on, and every number is written once, every child
    counted once."""
    first = STRAGGLER * 10 + 1
    run_id = cluster.submit(
        "message_straggler", n=CHILDREN * 10, slow_from=first, slow_to=first + 9, slow=0.8
    )
    status = dtask.get_run(run_id).wait(timeout=240)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen, by = written_by(sink, run_id)
    assert sorted(seen) == list(range(1, CHILDREN * 10 + 1))
    assert set(seen.values()) == {1}, "a number was written twice"
    pieces = children(run_id)
    assert len(pieces) > CHILDREN, "the straggler gave nothing away"
    assert all(state == "succeeded" for _, state, _ in pieces)
    assert {attempt for _, _, attempt in pieces} == {1}, "a child was counted twice"
    assert status.children.succeeded == len(pieces) and status.children.failed == 0
    carrier = by[first]  # the message the straggler ran in: many children's
    shared = {(n - 1) // 10 for n, m in by.items() if m == carrier}
    print(f"\nthe straggler's message ran {len(shared)} children; {len(pieces)} in all")
    # a message is sized by its children's time, its claim and bookkeeping included: 93-180
    # children here on 2 busy cores, MAX_BATCH where they take under 125 us all in
    assert len(shared) >= 20, f"the straggler ran in a message of {len(shared)} children"
    given = [n for n in range(first, first + 10) if by[n] != carrier]
    assert given, "no slow number ran elsewhere"
