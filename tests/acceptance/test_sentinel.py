"""Redis with Sentinel as broker and result backend (docs/deployment.md): a primary, a replica
and three sentinels (tests/support/sentinel.py), two workers on
``DTASK_BROKER_URL=sentinel://...``. The primary is SIGKILLed in the middle of a 2,000-child
run; the sentinels promote the replica, the workers follow it, and the run finishes with every
child succeeded once. Prints the time from the kill to the first child started after it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtask import services
from soak.cluster import FAST
from tests.conftest import running_workers, submitted
from tests.support.db import wait_for
from tests.support.pauses import pause_after
from tests.support.sentinel import MASTER, SentinelSet, sentinels

pytestmark = pytest.mark.acceptance

N, DELAY = 2000, 0.01
FROZEN_N = 500


@pytest.fixture
def redis_set(tmp_path: Path) -> Iterator[SentinelSet]:
    with sentinels(tmp_path) as found:
        yield found


@pytest.fixture
def env(dtask_env: dict[str, str], redis_set: SentinelSet) -> dict[str, str]:
    resolved = services.ensure_broker()  # the session's PostgreSQL, named explicitly
    return {
        **dtask_env,
        **FAST,
        "DTASK_DATABASE_URL": resolved.database_url,
        "DTASK_BROKER_URL": redis_set.url,
        "DTASK_SENTINEL_MASTER": MASTER,
    }


def counts(run_id: int) -> dict[str, int]:
    from sqlalchemy import text

    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, count(*) FROM dtask_children WHERE run_id = :r GROUP BY 1"),
            {"r": run_id},
        ).all()
    return {state: int(n) for state, n in rows}


def run_state(run_id: int) -> str:
    return services.store().runs.status(run_id).state.value


def test_the_primary_killed_mid_run_the_replica_takes_over_and_nothing_is_lost(
    env: dict[str, str], redis_set: SentinelSet, sink: Path, tmp_path: Path
) -> None:
    with running_workers(env, tmp_path, 2, "-c", "2") as workers:
        run_id = submitted(env, "tagged", n=N, delay=DELAY)
        wait_for(lambda: counts(run_id).get("succeeded", 0) >= N // 4, 120, "a quarter done")
        killed_at = time.time()
        redis_set.kill("primary")
        promoted = wait_for(
            lambda: (p := redis_set.master_port()) != redis_set.ports["primary"] and p, 60,
            "the sentinels to promote the replica",
        )  # fmt: skip
        assert promoted == redis_set.ports["replica"]
        wait_for(lambda: run_state(run_id) == "succeeded", 180, "the run to finish")
        assert counts(run_id) == {"succeeded": N}
        assert len(list(sink.glob(f"{run_id}-*.txt"))) == N  # every child ran (a file each)
        pause, resumed = pause_after(sink, run_id, killed_at)
        print(
            f"\nsentinel failover: children started again {resumed:.1f} s after the kill"
            f" (the longest pause in starts after it: {pause:.1f} s)"
        )
        assert all(w.proc.poll() is None for w in workers), "a worker died with the primary"


def test_a_frozen_sentinel_costs_each_process_one_timeout_not_one_per_connection(
    env: dict[str, str], redis_set: SentinelSet, sink: Path, tmp_path: Path
) -> None:
    """The first sentinel of the URL is frozen (SIGSTOP) for the whole run: every process
    asks it first, waits a network timeout, and must then keep asking the ones that answer.
    Each pass of the dispatcher and the reaper opening a connection (and so asking the frozen
    one again) ran the passes past their turns: a run of 2,000 children did not finish in
    180 s."""
    redis_set.freeze("s0")
    env = {**env, "DTASK_NETWORK_TIMEOUT": "2"}
    with running_workers(env, tmp_path, 2, "-c", "2"):
        started = time.monotonic()
        run_id = submitted(env, "tagged", n=FROZEN_N, delay=DELAY)
        wait_for(lambda: run_state(run_id) == "succeeded", 120, "the run to finish")
        took = time.monotonic() - started
        assert counts(run_id) == {"succeeded": FROZEN_N}
        print(f"\nfirst sentinel frozen: {FROZEN_N} children in {took:.1f} s")
