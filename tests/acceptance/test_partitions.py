"""Network partitions: a worker's link to PostgreSQL, to the broker, or to both, is cut so
that its packets are dropped silently (no RST, no ICMP), then healed.

The cut worker runs in a network namespace of its own (soak/netns.py) and reaches the
embedded PostgreSQL and Redis only through relays on the host ends of two veth pairs; the
other worker reaches them directly. Every number is printed (run with -s to see them).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy.engine import make_url

import dtask
from dtask import services
from dtask.services import embedded
from soak import netns
from tests.acceptance.test_faults import AMQP, FAST, purge_rabbitmq_queue, rabbitmq_reachable
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.cut_off import pids_of, progress, stamped
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

LEASE = float(FAST["DTASK_LEASE_TTL"])
REAPER = float(FAST["DTASK_REAPER_INTERVAL"])
ITEMS = 200  # per child: the stamped_range template's chunk
DELAY = 0.1  # seconds per item
EVERY = 60  # a checkpoint every 6 s: more than a lease and a step, so only the lease stops it
SLACK = 3.0  # a busy 2-core machine: scheduling, polling
# Celery's line when a pool process gives up storing a finished child's result (the chord's
# count): with bounded broker waits it comes within seconds, not when the link heals.
UNDELIVERED = "Exception raised outside body"
LINKS = {"postgres": ("db",), "broker": ("mq",), "both": ("db", "mq")}


@pytest.fixture(scope="module")
def namespaces_available() -> None:
    reason = netns.unavailable()
    if reason is not None:
        print(f"\nSKIPPED network partition tests: {reason}")
        pytest.skip(f"network namespaces unavailable: {reason}")


@dataclass
class Net:
    partition: netns.Partition
    inside: dict[str, str]  # the cut worker's environment: services through the relays
    outside: dict[str, str]

    def submit(self, template: str, **variables: object) -> int:
        args = [a for name, value in variables.items() for a in ("-e", f"{name}={value}")]
        result = subprocess.run(
            [DTASK, "submit", template, *args, "--json"],
            env=self.outside, cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return int(json.loads(result.stdout)["id"])


@pytest.fixture
def net(
    request: pytest.FixtureRequest, namespaces_available: None, dtask_env: dict[str, str]
) -> Iterator[Net]:
    """A namespace for the worker to be cut; ``request.param`` is the broker: redis or rabbitmq."""
    resolved = services.ensure_broker()  # the embedded Redis runs: the relay pipes to it
    url = make_url(services.database_url())
    pg_socket = f"{url.query['host']}/.s.PGSQL.{url.port or 5432}"
    redis_socket = str(embedded.redis_socket(Path(dtask_env["DTASK_HOME"])))
    outside = {**dtask_env, **FAST, "DTASK_NETWORK_TIMEOUT": "3"}
    partition = netns.Partition.create("db", "mq")
    db, mq = partition.links["db"], partition.links["mq"]
    relays = [netns.Relay(db.host, pg_socket), netns.Relay(mq.host, redis_socket)]
    backend = f"redis://{mq.host}:{relays[1].port}/0"
    broker = backend
    if request.param == "rabbitmq":
        if not rabbitmq_reachable():
            pytest.skip("no RabbitMQ at 127.0.0.1:5672")
        purge_rabbitmq_queue()
        amqp = urlsplit(AMQP)
        relays.append(netns.Relay(mq.host, (amqp.hostname or "", amqp.port or 5672)))
        where = f"{amqp.username}:{amqp.password}@{mq.host}:{relays[2].port}"
        broker = urlunsplit((amqp.scheme, where, amqp.path, "", ""))
        outside.update(  # the embedded services, named: not a mix
            DTASK_DATABASE_URL=resolved.database_url,
            DTASK_BROKER_URL=AMQP,
            DTASK_RESULT_BACKEND=resolved.result_backend,
        )
    inside = {
        **outside,
        "DTASK_DATABASE_URL": f"postgresql+psycopg://{url.username}@{db.host}:{relays[0].port}"
        f"/{url.database}",
        "DTASK_BROKER_URL": broker,
        "DTASK_RESULT_BACKEND": backend,
    }
    try:
        yield Net(partition, inside, outside)
    finally:
        partition.heal()
        for relay in relays:
            relay.close()
        partition.delete()


@pytest.mark.parametrize(
    ("cut", "net"),
    [("postgres", "redis"), ("broker", "redis"), ("both", "redis"), ("broker", "rabbitmq")],
    indirect=["net"],
)
def test_a_cut_worker_stops_its_children_and_rejoins_after_the_heal(
    cut: str, net: Net, sink: Path, tmp_path: Path
) -> None:
    links = LINKS[cut]
    cut_off_db = "db" in links
    inside = WorkerProcess(
        net.inside, tmp_path / "inside.log", "-c", "2", prefix=net.partition.command()
    )
    outside: WorkerProcess | None = None
    try:
        inside.wait_ready()
        run_id = net.submit("stamped_range", n=2 * ITEMS, delay=DELAY, every=EVERY)
        wait_for(
            lambda: (
                {pid for pid, _ in progress(run_id).values()} <= pids_of(inside)
                and len(progress(run_id)) == 2
            ),
            60,
            "the worker to be cut to run both children",
        )
        # the other worker starts now, so it has nothing to do but take over
        outside = WorkerProcess(net.outside, tmp_path / "outside.log", "-c", "2")
        outside.wait_ready()
        # cut just after both children committed a checkpoint: the next is 6 s away
        before = {i: done for i, (_, done) in progress(run_id).items()}
        wait_for(
            lambda: all(done > before[i] for i, (_, done) in progress(run_id).items()),
            EVERY * DELAY + 30,
            "both children to commit a checkpoint",
        )
        cut_at = time.time()
        net.partition.cut(*links)
        inside_pids = pids_of(inside)

        status = dtask.get_run(run_id).wait(timeout=120)
        assert status.state is dtask.RunState.SUCCEEDED, status.error

        def logged() -> bool:
            if cut_off_db:  # its children stopped with their lease and said why
                return all(f"stopping child {i};" in inside.output() for i in range(2))
            # its children finished there; it gives up delivering their results, still cut
            return inside.output().count(UNDELIVERED) >= 2

        with contextlib.suppress(AssertionError):  # asserted below, after the figures
            wait_for(logged, 30, "the cut worker to log what it could not do")
        inside_pids |= pids_of(inside)

        label = f"{cut} ({net.inside['DTASK_BROKER_URL'].split(':')[0]})"
        print(f"\n{label} cut at {cut_at:.3f}")
        for index in range(2):
            lines = stamped(sink, run_id, index)
            items = [item for item, _, _ in lines]
            assert set(items) == set(range(index * ITEMS + 1, (index + 1) * ITEMS + 1)), index
            duplicates = len(items) - len(set(items))
            mine = [ts for _, pid, ts in lines if pid in inside_pids]
            elsewhere = [ts for _, pid, ts in lines if pid not in inside_pids and ts > cut_at]
            last_output = max(mine) - cut_at
            resumed = min(elsewhere) - cut_at if elsewhere else None
            print(
                f"{label}: child {index}: cut -> last output of the cut worker {last_output:.2f} s,"
                " cut -> resumed elsewhere "
                + (f"{resumed:.2f} s" if resumed is not None else "(finished on the cut worker)")
                + f", items printed twice {duplicates}"
            )
            assert duplicates <= EVERY, f"child {index}: {duplicates} items re-printed"
            if cut_off_db:
                assert last_output <= LEASE + DELAY + 1.0, f"child {index} ran past its lease"
                assert resumed is not None and resumed <= LEASE + REAPER + SLACK, index
                line = next(
                    x for x in inside.output().splitlines() if f"stopping child {index};" in x
                )
                assert "cut off from PostgreSQL" in line and "lease expired" in line, line
            else:  # still fenced through PostgreSQL: it finishes where it is
                assert not elsewhere, f"child {index} ran elsewhere"
        if not cut_off_db:
            assert "cut off from PostgreSQL" not in inside.output()
        assert logged(), "the cut worker did not log what it could not do within 30 s"

        # Heal; with the other worker gone, new work can only run on the healed worker.
        net.partition.heal(*links)
        healed_at = time.time()
        outside.stop()
        assert inside.proc.poll() is None, "the cut worker must survive the cut"
        after = net.submit("stamped_range", n=2 * ITEMS, delay=0.005, every=50)
        status = dtask.get_run(after).wait(timeout=120)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
        print(f"{label}: heal -> new run done by the healed worker {time.time() - healed_at:.2f} s")
        for index in range(2):
            assert {pid for _, pid, _ in stamped(sink, after, index)} <= pids_of(inside)
    finally:
        for worker in (inside, outside):
            if worker is not None:
                worker.stop()
