"""Fault tolerance with real processes: kill, stop and restart things mid-run.

Each test runs on a fresh pair of `dtask worker` processes with short leases, against the
embedded Redis as broker and, when RabbitMQ answers on 127.0.0.1:5672, against it too. Every
child of a run is checked to have resumed from the checkpoint committed when the fault hit.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from sqlalchemy import Connection, text

import dtask
from dtask import services
from dtask.db.database import RUN_LOCKS
from dtask.services import embedded
from soak.cluster import FAST
from tests.conftest import WorkerProcess, submitted
from tests.support.db import child_row, children, owner_pid, wait_for

pytestmark = pytest.mark.acceptance

# A vhost of its own lets several checkouts run these tests side by side on one RabbitMQ.
AMQP = os.environ.get("DTASK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def rabbitmq_reachable() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 5672), timeout=1).close()
    except OSError:
        return False
    return True


def purge_rabbitmq_queue() -> None:
    from kombu import Connection

    with Connection(AMQP) as conn:
        channel = conn.channel()
        channel.queue_declare("dtask", durable=True, auto_delete=False)
        channel.queue_purge("dtask")


def rabbitmq_queue_size() -> int:
    from kombu import Connection

    with Connection(AMQP) as conn:
        return int(conn.channel().queue_declare("dtask", passive=True).message_count)


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def broker_env(request: pytest.FixtureRequest, dtask_env: dict[str, str]) -> dict[str, str]:
    if request.param == "rabbitmq":
        if not rabbitmq_reachable():
            pytest.skip("no RabbitMQ at 127.0.0.1:5672")
        purge_rabbitmq_queue()
        resolved = services.ensure_broker()  # the embedded PostgreSQL and Redis, named explicitly
        return {
            **dtask_env,
            **FAST,
            "DTASK_DATABASE_URL": resolved.database_url,
            "DTASK_BROKER_URL": AMQP,
            "DTASK_RESULT_BACKEND": resolved.result_backend,
        }
    return {**dtask_env, **FAST}


@dataclass
class Cluster:
    env: dict[str, str]
    workers: list[WorkerProcess]
    sink: Path

    @property
    def home(self) -> Path:
        return Path(self.env["DTASK_HOME"])

    def submit(self, template: str, **variables: object) -> int:
        return submitted(self.env, template, **variables)

    def worker_of(self, pid: int) -> WorkerProcess:
        group = os.getpgid(pid)
        return next(w for w in self.workers if w.proc.pid == group)

    def kill_worker(self, worker: WorkerProcess) -> None:
        os.killpg(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(10)

    def output(self) -> str:
        return "\n".join(w.output() for w in self.workers)

    def sink_numbers(self, run_id: int, index: int) -> list[int]:
        path = self.sink / f"{run_id}-{index}.txt"
        return [int(x) for x in path.read_text().split() if x.isdigit()]


@pytest.fixture
def cluster(broker_env: dict[str, str], sink: Path, tmp_path: Path) -> Iterator[Cluster]:
    workers = [WorkerProcess(broker_env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        yield Cluster(broker_env, workers, sink)
    finally:
        for w in workers:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGCONT)
            w.stop()


def running_with_checkpoint(run_id: int, index: int, done: int) -> int | None:
    row = child_row(run_id, index)
    progressed = isinstance(row.checkpoint, dict) and row.checkpoint["done"] >= done
    return owner_pid(row.owner) if row.state == "running" and row.owner and progressed else None


def progress(run_id: int) -> dict[int, tuple[str, int, int | None]]:
    """index -> (state, checkpointed items, owner pid) for every child of the run."""
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT index, state, checkpoint, owner FROM dtask_children WHERE run_id = :r"),
            {"r": run_id},
        ).all()
    return {
        int(r.index): (
            str(r.state),
            int(r.checkpoint["done"]) if isinstance(r.checkpoint, dict) else 0,
            owner_pid(r.owner) if r.owner else None,
        )
        for r in rows
    }


def running_checkpointed(run_id: int, done: int) -> dict[int, int] | None:
    """index -> owner pid of the running children, once child 0 and every other running
    child have at least ``done`` items checkpointed."""
    now = progress(run_id)
    running = {i: (d, pid) for i, (s, d, pid) in now.items() if s == "running" and pid}
    ready = 0 in running and all(d >= done for d, _ in running.values())
    return {i: pid for i, (_, pid) in running.items()} if ready else None


def mid_run(run_id: int, done: int) -> bool:
    """Some child of the run runs with ``done`` items checkpointed: the run is under way,
    whichever child a poll on a busy machine happens to see (child 0 may be done by then)."""
    return any(s == "running" and d >= done for s, d, _ in progress(run_id).values())


def worker_pids(worker: WorkerProcess) -> set[int]:
    return {worker.proc.pid, *(c.pid for c in psutil.Process(worker.proc.pid).children())}


def assert_resumed(cluster: Cluster, run_id: int, index: int, lo: int, hi: int, done: int) -> None:
    """Every item of lo..hi printed; where a later attempt started over, it started from a
    checkpoint at least ``done`` items in (what was committed when the fault hit), re-doing at
    most one checkpoint interval (5 items)."""
    seen = cluster.sink_numbers(run_id, index)
    assert set(seen) == set(range(lo, hi + 1)), index
    restarts = [b for a, b in itertools.pairwise(seen) if b <= a]
    assert all(r >= lo + done for r in restarts), (
        f"child {index} started over at {restarts} with {done} items checkpointed"
    )
    assert len(seen) - len(set(seen)) <= 5 * len(restarts), index


def assert_succeeded_resuming_every_child(
    cluster: Cluster, run_id: int, children: int, done: dict[int, int]
) -> None:
    status = dtask.get_run(run_id).wait(timeout=90)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    for index in range(children):  # slow_range children hold 20 items each
        assert_resumed(cluster, run_id, index, index * 20 + 1, index * 20 + 20, done.get(index, 0))


def checkpointed(run_id: int) -> dict[int, int]:
    return {i: d for i, (_, d, _) in progress(run_id).items()}


def test_1_sigkill_a_whole_worker_mid_child(cluster: Cluster) -> None:
    run_id = cluster.submit("slow_range", n=60, delay=0.1)
    owners = wait_for(lambda: running_checkpointed(run_id, 5), 30, "children to checkpoint")
    victim = cluster.worker_of(owners[0])
    pids = worker_pids(victim)
    done = checkpointed(run_id)
    cluster.kill_worker(victim)
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    interrupted = {i for i, pid in owners.items() if pid in pids}
    assert 0 in interrupted
    assert children(run_id) == [(i, "succeeded", 2 if i in interrupted else 1) for i in range(3)]
    for index in range(3):  # the interrupted resume from their checkpoint, the others run once
        assert_resumed(cluster, run_id, index, index * 20 + 1, index * 20 + 20, done[index])


@pytest.mark.parametrize("children", [2, 1])
def test_2_sigkill_only_the_pool_process_running_a_child(cluster: Cluster, children: int) -> None:
    """With one child, the run's master runs it in its own task (docs/scheduling.md): killed
    there, it resumes elsewhere from its checkpoint like any child (its lease expires)."""
    run_id = cluster.submit("slow_range", n=20 * children, delay=0.1)
    pid = wait_for(lambda: running_with_checkpoint(run_id, 0, 10), 60, "child 0 to checkpoint")
    done = checkpointed(run_id)
    os.kill(pid, signal.SIGKILL)
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert child_row(run_id, 0).attempt == 2
    for index in range(children):
        assert_resumed(cluster, run_id, index, index * 20 + 1, index * 20 + 20, done[index])
    assert all(w.proc.poll() is None for w in cluster.workers), "the workers themselves survive"


def _run_lock_sessions(run_id: int, granted: bool) -> list[int]:
    """Pids (from application_name) of dtask sessions holding/awaiting this run's lock."""
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a"
                " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted = :granted"
                " AND l.classid = :ns AND l.objid = :run AND a.application_name LIKE 'dtask:%'"
            ),
            {"ns": RUN_LOCKS, "run": run_id, "granted": granted},
        ).all()
    return [int(r.application_name.split(":")[1]) for r in rows]


def _advisory_waiters(run_id: int) -> list[int]:
    return _run_lock_sessions(run_id, granted=False)


def _hold_run_lock(run_id: int) -> Connection:
    conn = services.store().engine.connect()
    conn.execute(text("SELECT pg_advisory_lock(:ns, :run)"), {"ns": RUN_LOCKS, "run": run_id})
    return conn


def _release_run_lock(conn: Connection, run_id: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:ns, :run)"), {"ns": RUN_LOCKS, "run": run_id})
    conn.close()


def test_3_master_killed_after_inserting_children_before_sending_the_chord(
    cluster: Cluster,
) -> None:
    hold = cluster.sink / f"hold-{uuid.uuid4().hex}"
    hold.touch()
    run_id = cluster.submit("held_split", n=50, hold=hold.name)
    # The master splits inside its first transaction, holding the run's lock, until the hold
    # goes. We queue for the lock behind it first, so we hold it the moment the children are
    # committed and the master blocks before sending the chord, however slow the machine.
    wait_for(lambda: _run_lock_sessions(run_id, granted=True), 20, "the master to split")
    taken: list[Connection] = []
    queued = threading.Thread(target=lambda: taken.append(_hold_run_lock(run_id)))
    queued.start()
    wait_for(lambda: os.getpid() in _advisory_waiters(run_id), 20, "our lock to queue")
    hold.unlink()
    queued.join(60)
    assert taken, "the split did not end within 60 s of its hold going"
    held = taken[0]
    try:
        assert services.store().runs.get(run_id).state.value == "splitting"
        assert dtask.get_run(run_id).status().children.total == 5
        waiters = wait_for(lambda: _advisory_waiters(run_id), 20, "the master to block")
        cluster.kill_worker(cluster.worker_of(waiters[0]))
    finally:
        _release_run_lock(held, run_id)
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert children(run_id) == [(i, "succeeded", 1) for i in range(5)]
    for index in range(5):
        assert cluster.sink_numbers(run_id, index) == list(range(index * 10 + 1, index * 10 + 11))


def test_4_the_chord_callback_is_lost_with_its_worker(cluster: Cluster, tmp_path: Path) -> None:
    """The callback's worker dies and its message is gone (on RabbitMQ it would be requeued:
    every worker is killed and the queue purged first), so only the reaper can finalize."""
    run_id = cluster.submit("slow_range", n=40, delay=0.1)  # two children of 2 s: time to lock
    wait_for(lambda: services.store().runs.get(run_id).state.value == "running", 60, "dispatch")
    held = _hold_run_lock(run_id)
    try:
        wait_for(lambda: dtask.get_run(run_id).status().children.succeeded == 2, 30, "children")
        main_pids = {w.proc.pid for w in cluster.workers}
        # the callback (in a pool process) blocks on the lock we hold: kill every worker
        wait_for(
            lambda: [p for p in _advisory_waiters(run_id) if p not in main_pids], 20, "finalize"
        )
        for worker in cluster.workers:
            cluster.kill_worker(worker)
        if "DTASK_BROKER_URL" in cluster.env:
            wait_for(lambda: rabbitmq_queue_size() > 0, 20, "RabbitMQ to requeue the callback")
            purge_rabbitmq_queue()
    finally:
        _release_run_lock(held, run_id)
    assert services.store().runs.get(run_id).state.value == "running"
    fresh = WorkerProcess(cluster.env, tmp_path / "fresh.log", "-c", "2")
    cluster.workers.append(fresh)
    fresh.wait_ready()
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert "its callback never ran" in fresh.output()


def test_5_redis_restarted_with_its_data_gone_mid_run(cluster: Cluster) -> None:
    run_id = cluster.submit("slow_range", n=200, delay=0.05)
    wait_for(lambda: mid_run(run_id, 5), 60, "children to checkpoint")
    done = checkpointed(run_id)
    embedded.restart_redis(cluster.home)
    assert_succeeded_resuming_every_child(cluster, run_id, 10, done)


@pytest.mark.parametrize("crash", [False, True], ids=["fast", "immediate"])
def test_6_postgresql_restarted_mid_run(cluster: Cluster, crash: bool) -> None:
    run_id = cluster.submit("slow_range", n=120, delay=0.05)
    wait_for(lambda: mid_run(run_id, 5), 60, "children to checkpoint")
    done = checkpointed(run_id)
    embedded.restart_postgres(cluster.home, crash=crash)
    assert_succeeded_resuming_every_child(cluster, run_id, 6, done)


def test_7_a_stopped_worker_wakes_up_to_find_its_child_taken_over(cluster: Cluster) -> None:
    run_id = cluster.submit("slow_range", n=20, delay=0.2)
    pid = wait_for(lambda: running_with_checkpoint(run_id, 0, 5), 30, "child 0 to checkpoint")
    stale = cluster.worker_of(pid)
    os.killpg(stale.proc.pid, signal.SIGSTOP)
    try:
        status = dtask.get_run(run_id).wait(timeout=60)
    finally:
        os.killpg(stale.proc.pid, signal.SIGCONT)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    wait_for(lambda: "was taken over" in stale.output(), 20, "the stale owner to notice")
    time.sleep(1)
    after = dtask.get_run(run_id).status()
    assert after.state is dtask.RunState.SUCCEEDED and after.finished_at == status.finished_at
    assert children(run_id) == [(0, "succeeded", 2)]
    # it carries on with other work: alone now, it runs a new run to the end
    for other in [w for w in cluster.workers if w is not stale]:
        cluster.kill_worker(other)
    pids = worker_pids(stale)
    second = cluster.submit("slow_range", n=40, delay=0.1)
    owners = wait_for(lambda: {p for _, _, p in progress(second).values() if p}, 30, "a claim")
    status = dtask.get_run(second).wait(timeout=60)
    assert owners <= pids and status.state is dtask.RunState.SUCCEEDED, (owners, status.error)
    assert children(second) == [(0, "succeeded", 1), (1, "succeeded", 1)]


def test_8_a_child_that_always_kills_its_process_fails_after_max_attempts(
    cluster: Cluster,
) -> None:
    run_id = cluster.submit("poison", n=30, bad=15)
    status = dtask.get_run(run_id).wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    assert status.children.succeeded == 2 and status.children.failed == 1
    assert status.error is not None and "gave up after 3 attempt(s)" in status.error
    assert "died while running it" in status.error
    attempts = (cluster.sink / f"{run_id}-1.txt").read_text().splitlines()
    assert attempts == ["attempt 1", "attempt 2", "attempt 3"]
    assert all(w.proc.poll() is None for w in cluster.workers)
    assert all(psutil.Process(w.proc.pid).status() != psutil.STATUS_ZOMBIE for w in cluster.workers)
