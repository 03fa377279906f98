"""PostgreSQL failover (docs/deployment.md): a primary and its streaming standby
(tests/support/replicas.py), workers on a ``DTASK_DATABASE_URL`` naming both hosts with
``target_session_attrs=read-write``. The primary is stopped as a crash in the middle of a run
and the standby promoted; the workers, a beat and `dtask serve` follow it (the beat fires its
schedule, the API answers from the new primary) and the run finishes with every item done. With
synchronous (and with asynchronous, caught up) replication nothing committed is lost and no item
is done twice; with a standby that lags (its WAL receiver stopped for the last seconds) the
fences make the lost tail safe: a child whose last writes were lost runs again from its last
kept checkpoint, and is counted once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dtask import services
from soak.cluster import FAST
from tests.conftest import DTASK, REPO, BeatProcess, running_workers, submitted
from tests.support.api import call, start_server, token
from tests.support.db import wait_for
from tests.support.replicas import Replicated, replicated

pytestmark = pytest.mark.acceptance

N, DELAY = 1200, 0.02  # 60 children of 20 numbers, 0.4 s each
EVERY, SLOTS = 5, 4  # slow_range's checkpoint_every; two workers of two


@pytest.fixture(params=["synchronous", "lagging"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replicated]:
    """``lagging``: asynchronous, and the standby receives nothing for the last seconds
    before the crash (the primary's WAL sender stopped): the new primary lacks that tail.
    (Asynchronous and caught up behaves as synchronous: docs/deployment.md.)"""
    with replicated(tmp_path / "pg", synchronous=request.param == "synchronous") as found:
        found.lagging = request.param == "lagging"
        yield found


def states(pair: Replicated, run_id: int) -> Counter[str]:
    with psycopg.connect(pair.conninfo) as conn:
        rows = conn.execute(
            "SELECT state, count(*) FROM dtask_children WHERE run_id = %s GROUP BY 1", (run_id,)
        ).fetchall()
    return Counter({state: int(n) for state, n in rows})


def run_state(pair: Replicated, run_id: int) -> str | None:
    try:
        with psycopg.connect(pair.conninfo) as conn:
            row = conn.execute("SELECT state FROM dtask_runs WHERE id = %s", (run_id,)).fetchone()
    except psycopg.OperationalError:  # no host takes writes yet
        return None
    return None if row is None else str(row[0])


def pulses(pair: Replicated) -> int:
    """Runs the beat made of the ``pulse`` schedule."""
    with psycopg.connect(pair.conninfo) as conn:
        row = conn.execute("SELECT count(*) FROM dtask_runs WHERE schedule = 'pulse'").fetchone()
    return int(row[0]) if row else 0


def test_the_primary_crashes_mid_run_the_standby_is_promoted_and_no_item_is_lost(
    dtask_env: dict[str, str], pair: Replicated, tmp_path: Path
) -> None:
    broker = services.ensure_broker()  # the session's Redis, named
    sink = tmp_path / "sink"  # run ids start at 1 in each new database
    sink.mkdir()
    env = {
        **dtask_env,
        **FAST,
        "DTASK_TEST_SINK": str(sink),
        "DTASK_DATABASE_URL": pair.url,
        "DTASK_BROKER_URL": broker.broker_url,
        "DTASK_RESULT_BACKEND": broker.result_backend,
    }
    migrated = subprocess.run([DTASK, "migrate"], env=env, cwd=REPO, capture_output=True, text=True)
    assert migrated.returncode == 0, migrated.stderr
    pulse = [
        "schedule",
        "add",
        "pulse",
        "tagged",
        "--var",
        "n=1",
        "--var",
        "delay=0",
        "--every",
        "1",
    ]
    added = subprocess.run([DTASK, *pulse], env=env, cwd=REPO, capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    secret = token(env, "default")
    with contextlib.ExitStack() as stack:
        beat = BeatProcess(env, tmp_path / "beat.log")
        stack.callback(beat.stop)
        server, api = start_server(env, tmp_path / "serve.log")
        stack.callback(server.stop)
        stack.enter_context(running_workers(env, tmp_path, 2, "-c", "2"))
        beat.wait_ready()
        run_id = submitted(env, "slow_range", n=N, delay=DELAY)
        wait_for(lambda: states(pair, run_id)["succeeded"] >= 15, 120, "a quarter of the run")
        if pair.lagging:
            os.kill(pair.sender(), signal.SIGSTOP)  # killed with the primary
            wait_for(lambda: states(pair, run_id)["succeeded"] >= 25, 60, "a tail to lose")
        before = states(pair, run_id)["succeeded"]
        crashed = time.monotonic()
        pair.kill_primary()
        pair.promote()
        promoted = time.monotonic() - crashed
        progress = lambda: states(pair, run_id)["succeeded"] > before  # noqa: E731
        wait_for(progress, 120, "a child to finish on the new primary")
        resumed = time.monotonic() - crashed
        fired = pulses(pair)
        wait_for(lambda: pulses(pair) > fired, 60, "the beat to fire on the new primary")
        wait_for(lambda: run_state(pair, run_id) == "succeeded", 180, "the run to finish")
        shown = call(api, "GET", f"/runs/{run_id}", secret)  # dtask serve, on the new primary
        assert (shown.status, shown.body["state"]) == (200, "succeeded"), shown
    assert states(pair, run_id) == Counter({"succeeded": N // 20})
    seen = Counter(int(x) for f in sink.glob(f"{run_id}-*.txt") for x in f.read_text().split())
    assert sorted(seen) == list(range(1, N + 1)), "an item was never done"
    again = sum(count - 1 for count in seen.values())
    if pair.lagging:
        assert again > 0, "the standby lost no tail: nothing was tested"
    else:  # every commit kept: a running child stopped by the outage (longer than its
        # lease) redoes what it did since its last checkpoint, nothing more
        assert again <= EVERY * SLOTS, again
    print(
        f"\npostgresql failover: promoted {promoted:.1f} s after the crash, a child finished on"
        f" the new primary {resumed:.1f} s after it; items done twice: {again}"
    )
