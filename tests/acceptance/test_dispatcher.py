"""The dispatcher (DTASK_DISPATCH=window) with real workers: the broker holds a bounded window,
a high-priority run overtakes a backlog, clients share the slots, a client's max_running
holds. On Redis and, where the issue asks it, on RabbitMQ."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from dtask import services
from tests.acceptance.test_faults import broker_env
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance
__all__ = ["broker_env"]  # both brokers, the fault tests' short leases

WINDOW = 6


@pytest.fixture
def window_env(broker_env: dict[str, str]) -> dict[str, str]:
    return {**broker_env, "DTASK_DISPATCH": "window", "DTASK_DISPATCH_INTERVAL": "0.05"}


@pytest.fixture
def workers(window_env: dict[str, str], tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    started = [
        WorkerProcess(window_env, tmp_path / f"w{i}.log", "-c", "2", "-n", f"w{i}-%h@%h")
        for i in range(2)
    ]
    try:
        for w in started:
            w.wait_ready()
        yield started
    finally:
        for w in started:
            w.stop()


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [DTASK, *argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def submit(env: dict[str, str], *options: str, n: int, delay: float) -> int:
    made = cli(
        env, "submit", "slow_range", "-e", f"n={n}", "-e", f"delay={delay}", "--json", *options
    )
    return int(json.loads(made.stdout)["id"])


def query(sql: str, **params: object) -> list[tuple[object, ...]]:
    with services.store().engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def state(run_id: int) -> str:
    return str(query("SELECT state FROM dtask_runs WHERE id = :r", r=run_id)[0][0])


def finished(run_id: int) -> int:
    return int(
        query(
            "SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'succeeded'",
            r=run_id,
        )[0][0]
    )


def starts(*run_ids: int) -> list[tuple[datetime, int]]:
    """(first start, run) of every started child of the runs, in start order."""
    rows = query(
        "SELECT started_at, run_id FROM dtask_children WHERE run_id = ANY(:r)"
        " AND started_at IS NOT NULL ORDER BY started_at",
        r=list(run_ids),
    )
    return [(at, int(run)) for at, run in rows]  # type: ignore[misc]


def created(run_id: int) -> datetime:
    at = query("SELECT created_at FROM dtask_runs WHERE id = :r", r=run_id)[0][0]
    assert isinstance(at, datetime)
    return at


def test_the_broker_holds_a_bounded_window_and_every_child_runs_once(
    window_env: dict[str, str], tmp_path: Path, sink: Path
) -> None:
    env = {**window_env, "DTASK_DISPATCH_WINDOW": str(WINDOW)}
    workers = [WorkerProcess(env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        run_id = submit(env, n=2000, delay=0.005)  # 100 children of 0.1 s
        most = 0
        deadline = time.monotonic() + 120
        while state(run_id) != "succeeded" and time.monotonic() < deadline:
            out = query(  # sent alone, or below the mark: in a message of several
                "SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'pending'"
                " AND (sent_at IS NOT NULL"
                "   OR index < (SELECT sent_through FROM dtask_runs WHERE id = :r))",
                r=run_id,
            )[0][0]
            most = max(most, int(out))  # type: ignore[call-overload]
            time.sleep(0.02)
        assert state(run_id) == "succeeded"
        print(f"\nat most {most} children in the broker (window {WINDOW})")
        assert 0 < most <= WINDOW
        for index in range(100):
            numbers = (sink / f"{run_id}-{index}.txt").read_text().split()
            assert numbers == [str(i) for i in range(index * 20 + 1, index * 20 + 21)]
    finally:
        for w in workers:
            w.stop()


def test_a_high_priority_run_overtakes_a_backlog(
    window_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    backlog = submit(window_env, "--priority", "2", n=6000, delay=0.01)  # 300 x 0.2 s
    wait_for(lambda: finished(backlog) >= 8, 60, "the backlog to be under way")
    urgent = submit(window_env, "--priority", "9", n=200, delay=0.01)  # 10 x 0.2 s
    wait_for(lambda: state(urgent) == "succeeded", 60, "the urgent run")
    first = next(at for at, run in starts(urgent) if run == urgent)
    waited = (first - created(urgent)).total_seconds()
    done_then = finished(backlog)
    both = starts(urgent, backlog)
    last = max(at for at, run in both if run == urgent)
    between = sum(1 for at, run in both if run == backlog and first < at < last)
    print(f"\nurgent run: first child {waited:.2f} s after submit; backlog {done_then}/300 done;"
          f" {between} backlog children started between its first and last")  # fmt: skip
    assert waited < 2.0
    # its children went ahead: only backlog children already taken or in a worker's prefetch
    # started among them (0-3 on a quiet machine; a count, so a busy one does not move it, where
    # the backlog's progress by then did: 30-44 of 300 quiet, 155 under a parallel suite)
    assert between <= 16
    assert done_then < 250
    wait_for(lambda: state(backlog) == "succeeded", 120, "the backlog")


@pytest.mark.parametrize("broker_env", ["redis"], indirect=True)
def test_two_clients_share_the_slots(
    window_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    for client in ("share-a", "share-b"):
        cli(window_env, "client", "set", client)
    first = submit(window_env, "--client", "share-a", n=4000, delay=0.01)  # 200 x 0.2 s
    time.sleep(3)
    second = submit(window_env, "--client", "share-b", n=4000, delay=0.01)
    wait_for(lambda: finished(second) >= 60, 120, "the second run to get going")
    order = starts(first, second)
    began = next(at for at, run in order if run == second)
    waited = (began - created(second)).total_seconds()
    both = [run for at, run in order if at >= began][:100]  # while both have work waiting
    share = both.count(second) / len(both)
    print(f"\nsecond run: first child {waited:.2f} s after submit; {share:.0%} of the next starts")
    assert waited < 2.0
    # stride scheduling alternates the two clients' sends; the starts of four pool processes
    # on a loaded machine stray from that (61 % once, in a clean-clone run beside other
    # suites). Without the fair share the newcomer gets its backlog's part or none.
    assert 0.35 <= share <= 0.65
    wait_for(lambda: state(first) == state(second) == "succeeded", 120, "both runs")


@pytest.mark.parametrize("broker_env", ["redis"], indirect=True)
def test_a_client_never_runs_more_than_its_max_running(
    window_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    cli(window_env, "client", "set", "capped", "--max-running", "2")
    cli(window_env, "client", "set", "free")
    capped = submit(window_env, "--client", "capped", n=400, delay=0.025)  # 20 x 0.5 s
    other = submit(window_env, "--client", "free", n=400, delay=0.025)
    wait_for(lambda: state(capped) == state(other) == "succeeded", 120, "both runs")

    def most_at_once(run_id: int) -> int:
        spans = query(
            "SELECT started_at, finished_at FROM dtask_children WHERE run_id = :r", r=run_id
        )
        events = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])  # type: ignore[list-item]
        running = most = 0
        for _, step in events:
            running += step
            most = max(most, running)
        return most

    print(f"\nat once: capped {most_at_once(capped)}, other {most_at_once(other)}")
    assert most_at_once(capped) <= 2
    assert most_at_once(other) >= 2


@pytest.mark.parametrize("broker_env", ["redis"], indirect=True)
def test_a_one_child_run_runs_in_its_master_unless_the_dispatcher_has_to_decide(
    window_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    """Alone, a one-child run's child runs in its master's task: no message of its own,
    no dispatcher pass. A client that caps its children running, or a run of two, goes
    through the dispatcher as before; so does one whose first attempt fails, once more."""
    cli(window_env, "client", "set", "one-capped", "--max-running", "1")

    def ran_in(*options: str, n: int = 1) -> list[str]:
        made = cli(window_env, "submit", "task_name", "-e", f"n={n}", "--json", *options)
        run_id = int(json.loads(made.stdout)["id"])
        wait_for(lambda: state(run_id) == "succeeded", 120, f"run {run_id}")
        return json.loads(cli(window_env, "result", str(run_id)).stdout)  # type: ignore[no-any-return]

    assert ran_in() == ["dtask.master"]
    assert ran_in("--client", "one-capped") == ["dtask.child"]
    assert ran_in(n=2) == ["dtask.child", "dtask.child"]
    flaky = cli(window_env, "submit", "flaky_range", "-e", "n=5", "-e", "fail_at=3", "--json")
    run_id = int(json.loads(flaky.stdout)["id"])
    wait_for(lambda: state(run_id) == "succeeded", 120, f"run {run_id}")
    attempts = query("SELECT attempt FROM dtask_children WHERE run_id = :r", r=run_id)
    assert attempts == [(2,)]


BURST = """
import json, sys
import dtask
burst = [dtask.submit("slow_range", {"n": 1, "delay": 0.05}).id for _ in range(200)]
urgent = dtask.submit("slow_range", {"n": 1, "delay": 0.05}, priority=9).id
print(json.dumps({"burst": burst, "urgent": urgent}))
"""


@pytest.mark.parametrize("broker_env", ["redis"], indirect=True)
def test_a_high_priority_one_child_run_overtakes_a_burst_of_them(
    window_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    """One-child runs run in their masters, so the masters' broker order is theirs: on Redis a
    run's master goes at its priority's level, and a priority-9 run submitted after 200
    default ones does not wait for them all."""
    made = subprocess.run(
        [sys.executable, "-c", BURST], env=window_env, cwd=REPO, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    ids = json.loads(made.stdout)
    burst, urgent = ids["burst"], ids["urgent"]

    def succeeded() -> int:
        return int(
            query(
                "SELECT count(*) FROM dtask_runs WHERE id = ANY(:ids) AND state = 'succeeded'",
                ids=[*burst, urgent],
            )[0][0]
        )

    wait_for(lambda: succeeded() == len(burst) + 1, 120, "the runs")
    urgent_done = query("SELECT finished_at FROM dtask_runs WHERE id = :r", r=urgent)[0][0]
    urgent_made = query("SELECT created_at FROM dtask_runs WHERE id = :r", r=urgent)[0][0]

    def finished_after(moment: datetime) -> int:
        return int(
            query(
                "SELECT count(*) FROM dtask_runs WHERE id = ANY(:ids) AND finished_at > :t",
                ids=burst,
                t=moment,
            )[0][0]
        )

    # what it could overtake: the burst's runs not finished when it was submitted (a busy
    # machine's workers keep up with a starved submitter: 200 on a quiet one, 3 seen)
    later, behind = finished_after(urgent_done), finished_after(urgent_made)
    print(f"\n{later} of the {behind} default-priority runs unfinished at its submit finished"
          " after the priority-9 one")  # fmt: skip
    if behind < 20:
        pytest.skip(f"only {behind} of the burst were unfinished when the urgent run came")
    # In FIFO order it would finish after all of them but the few in flight; how far ahead
    # it gets depends on the machine's pace (61 of 200 on a loaded one, more on a quiet one):
    # that figure is bench.small_runs's, this bound only says it overtook a large share.
    assert later >= behind // 10, (later, behind)


@pytest.mark.parametrize("broker_env", ["redis"], indirect=True)
def test_a_new_run_s_children_leave_once_its_first_child_is_timed(
    window_env: dict[str, str], tmp_path: Path
) -> None:
    """A new run's first children leave with its split, one to a message (their time is not
    known). The rest leave as soon as the first child's time sizes their messages, from the
    pool process that timed it: not at the next pass of the main processes' loops, which
    here are at their idle pace (a pass every 50 s)."""
    env = {**window_env, "DTASK_DISPATCH_INTERVAL": "5"}
    worker = WorkerProcess(env, tmp_path / "w.log", "-c", "2")
    try:
        worker.wait_ready()
        wait_for(
            lambda: idle_for() > 30, 60, "the worker's dispatcher loop to find nothing and idle"
        )
        made = cli(env, "submit", "tiny", "-e", "n=40", "-e", "fail_every=0", "--json")
        run_id = int(json.loads(made.stdout)["id"])
        wait_for(lambda: len(sends(run_id)) >= 2, 30, "a second send of the run's children")
        first = sends(run_id)[0]
        assert first[1] <= 4, first  # two messages of one child per slot
        assert idle_for() > 10, "a loop's pass sent them, not the timed child's process"
    finally:
        worker.stop()


def idle_for() -> float:
    """Seconds until the cluster's next dispatcher pass (the loops' slot)."""
    found = query(
        "SELECT extract(epoch from expires_at - now()) FROM dtask_leases"
        " WHERE name = 'pass:dispatcher'"
    )
    return float(found[0][0]) if found else 0.0


def sends(run_id: int) -> list[tuple[datetime, int]]:
    """Each send of the run's children: its time and how many it sent (alone, or in a message
    of several: its row)."""
    return [
        (at, int(n))  # type: ignore[call-overload]
        for at, n in query(
            "SELECT sent_at, count(*) FROM dtask_children WHERE run_id = :r"
            " AND sent_at IS NOT NULL GROUP BY 1"
            " UNION ALL SELECT sent_at, sum(children) FROM dtask_messages WHERE run_id = :r"
            " GROUP BY 1 ORDER BY 1",
            r=run_id,
        )
    ]
