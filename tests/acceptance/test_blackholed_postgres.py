"""A worker whose link to PostgreSQL is blackholed (issue 58, item 11): a relay that stops
every byte without closing anything, so the worker's kernel sees its bytes acknowledged and no
TCP timer of its own (``tcp_user_timeout``, keepalives) ever fires, as behind a hung pooler,
a frozen server or a middlebox that drops what it should forward. Only dtask's bound on its
own clock (dtask/db/watchdog.py) notices. Before it, the cut worker said nothing until the
heal: its process's one or two connections waited on statements that never came back, and
every other caller waited on the pool behind them.

Without root (tests/support/blackhole.py); test_partitions.py cuts a veth link in a network
namespace instead. Every number is printed (run with -s to see them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

import dtask
from dtask import services
from soak.cluster import FAST
from tests.conftest import WorkerProcess, submitted
from tests.support.blackhole import BlackholeRelay
from tests.support.cut_off import pids_of, progress, stamped
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

LEASE = float(FAST["DTASK_LEASE_TTL"])
NETWORK_TIMEOUT = 3.0
ITEMS = 200  # per child: the stamped_range template's chunk
DELAY = 0.05  # seconds per item
EVERY = 120  # a checkpoint every 6 s: more than a lease, so only the lease stops a child
# Generous bounds for a busy 2-core machine; the figures printed are far below them.
SAYS_SO_WITHIN = 30.0  # measured 3.7-4.1 s (the watchdog, network timeout 3 s); before: never
RESUMED_WITHIN = 30.0  # measured 3.1-3.5 s (lease 3 s, reaper 0.5 s)


@pytest.fixture
def relay(dtask_env: dict[str, str]) -> Iterator[BlackholeRelay]:
    url = make_url(services.database_url())
    relay = BlackholeRelay(f"{url.query['host']}/.s.PGSQL.{url.port or 5432}")
    try:
        yield relay
    finally:
        relay.close()


def test_a_worker_cut_off_by_a_blackhole_says_so_and_its_children_resume_elsewhere(
    relay: BlackholeRelay, dtask_env: dict[str, str], sink: Path, tmp_path: Path
) -> None:
    resolved = services.ensure_broker()
    outside = {
        **dtask_env,
        **FAST,
        "DTASK_NETWORK_TIMEOUT": str(NETWORK_TIMEOUT),
        "DTASK_DATABASE_URL": resolved.database_url,  # named, as the inside's: not a mix
        "DTASK_BROKER_URL": resolved.broker_url,
        "DTASK_RESULT_BACKEND": resolved.result_backend,
    }
    url = make_url(resolved.database_url)
    through = f"postgresql+psycopg://{url.username}@127.0.0.1:{relay.port}/{url.database}"
    inside = {**outside, "DTASK_DATABASE_URL": through}
    cut = WorkerProcess(inside, tmp_path / "cut.log", "-c", "2")
    other: WorkerProcess | None = None
    try:
        cut.wait_ready()
        run_id = submitted(outside, "stamped_range", n=2 * ITEMS, delay=DELAY, every=EVERY)
        wait_for(
            lambda: (
                len(progress(run_id)) == 2
                and {pid for pid, _ in progress(run_id).values()} <= pids_of(cut)
            ),
            60,
            "the worker to be cut to run both children",
        )
        other = WorkerProcess(outside, tmp_path / "other.log", "-c", "2")
        other.wait_ready()
        wait_for(
            lambda: all(done > 0 for _, done in progress(run_id).values()),
            EVERY * DELAY + 30,
            "both children to commit a checkpoint",
        )
        cut_pids = pids_of(cut)
        before = len(cut.output())
        cut_at, cut_clock = time.monotonic(), time.time()
        relay.cut()

        def said(what: str, times: int = 1) -> bool:
            return cut.output()[before:].count(what) >= times

        with contextlib.suppress(AssertionError):  # asserted below, with the figure
            wait_for(lambda: said("cannot reach PostgreSQL"), SAYS_SO_WITHIN, "the cut worker")
        says_so = time.monotonic() - cut_at
        print(f"\ncut -> the cut worker says it cannot reach PostgreSQL: {says_so:.2f} s")
        assert said("cannot reach PostgreSQL"), (
            f"the cut worker said nothing within {SAYS_SO_WITHIN:g} s of the cut:\n"
            + cut.output()[before:][-3000:]
        )

        status = dtask.get_run(run_id).wait(timeout=120)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        for index in range(2):
            lines = stamped(sink, run_id, index)
            items = [item for item, _, _ in lines]
            assert set(items) == set(range(index * ITEMS + 1, (index + 1) * ITEMS + 1)), index
            mine = [ts for _, pid, ts in lines if pid in cut_pids]
            elsewhere = [ts for _, pid, ts in lines if pid not in cut_pids and ts > cut_clock]
            last, resumed = max(mine) - cut_clock, min(elsewhere) - cut_clock
            print(
                f"child {index}: cut -> last output of the cut worker {last:.2f} s,"
                f" -> resumed elsewhere {resumed:.2f} s,"
                f" items printed twice {len(items) - len(set(items))}"
            )
            assert last <= LEASE + DELAY + 1.0, f"child {index} ran past its lease"
            assert resumed <= RESUMED_WITHIN, f"child {index} resumed {resumed:.1f} s after"

        # each child's own line, once its lease ran out and PostgreSQL gave no answer
        wait_for(lambda: said("cut off from PostgreSQL", 2), 60, "both children's lines")
        print(f"cut -> both children's 'cut off' lines: {time.monotonic() - cut_at:.2f} s")

        # Heal: with the other worker gone, new work can only run on the healed worker,
        # through connections opened anew where the dropped ones were
        relay.heal()
        healed_at = time.monotonic()
        other.stop()
        assert cut.proc.poll() is None, "the cut worker must survive the cut"
        after = submitted(outside, "stamped_range", n=2 * ITEMS, delay=0.002, every=100)
        status = dtask.get_run(after).wait(timeout=120)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        print(f"heal -> a new run done by the healed worker: {time.monotonic() - healed_at:.2f} s")
        for index in range(2):
            assert {pid for _, pid, _ in stamped(sink, after, index)} <= pids_of(cut)
    finally:
        relay.heal()
        for worker in (cut, other):
            if worker is not None:
                worker.stop()
