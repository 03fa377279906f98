"""No single input stops the cluster (issue 35): a value past any bound is refused where it
enters, creates nothing and leaves every other client's runs going; a frozen dispatcher
stops dispatch for its lease, not for PostgreSQL's idle limit. Two real workers, a real
`dtask serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.api import call, call_raw, start_server, token
from tests.support.db import run_count

pytestmark = pytest.mark.acceptance


def schedule_count() -> int:
    with services.store().engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM dtask_schedules")).scalar_one())


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def another_client_finishes(client: str = "bystander") -> None:
    """An ordinary run of another client, of three children, is dispatched and finishes."""
    dtask.set_client(client)
    run = dtask.submit("sum_squares", {"n": 3000}, client=client)
    status = run.wait(timeout=90)
    assert status.state.value == "succeeded", status
    assert (status.children.succeeded, status.result) == (3, 3000 * 3001 * 6001 // 6)


@pytest.fixture(scope="module")
def server(
    dtask_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    proc, base = start_server(dtask_env, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        yield base
    finally:
        proc.stop()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--delay-tolerance", "1e12"], "delay tolerance must be over 0 and at most 315,360,000"),
        (["--delay-tolerance", "315360001"], "delay tolerance must be over 0 and at most"),
        (["--execution-cap", "1e300"], "execution cap must be over 0 and at most 315,360,000"),
    ],
)
def test_a_submit_past_a_bound_is_refused_and_stops_nobody(
    dtask_env: dict[str, str], workers: list[WorkerProcess], flags: list[str], says: str
) -> None:
    dtask.set_client("evil")  # an ordinary client, with no special rights
    before = run_count()
    done = cli(dtask_env, "submit", "print_range", "-e", "n=5", "--client", "evil", *flags)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert run_count() == before  # refused: nothing created
    another_client_finishes()


def test_a_schedule_past_a_bound_is_refused(dtask_env: dict[str, str]) -> None:
    before = schedule_count()
    done = cli(
        dtask_env, "schedule", "add", "zbad", "print_range", "-e", "n=1",
        "--every", "5", "--delay-tolerance", "1e16",
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "delay tolerance must be over 0 and at most" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
    assert schedule_count() == before


def test_a_far_eta_is_refused_in_python_and_creates_nothing(workers: list[WorkerProcess]) -> None:
    from datetime import UTC, datetime, timedelta, timezone

    from dtask.exceptions import InvalidStart

    before = run_count()
    for eta in (
        datetime(9999, 12, 31, tzinfo=UTC),
        datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=14))),  # past 9999 in UTC
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),  # before year 1 in UTC
    ):
        with pytest.raises(InvalidStart, match="eta must lie between 1970 and 8999"):
            dtask.submit("print_range", {"n": 2}, eta=eta)
    assert run_count() == before
    another_client_finishes()


def test_over_http_a_bad_number_is_a_422_and_creates_nothing(
    dtask_env: dict[str, str], server: str
) -> None:
    dtask.set_client("evil-http")
    evil = token(dtask_env, "evil-http")
    before = run_count()
    for body in (
        {"template": "print_range", "variables": {"n": 5}, "delay_tolerance": 1e12},
        {"template": "print_range", "variables": {"n": 5}, "delay_tolerance": 1e308},
        {"template": "print_range", "variables": {"n": 5}, "execution_cap": 1e12},
        {"template": "print_range", "variables": {"n": 5}, "priority": 10**30},
    ):
        reply = call(server, "POST", "/runs", evil, body)
        assert reply.status == 422, (body, reply)
        assert isinstance(reply.body, dict) and reply.body.get("error"), reply
    huge = '{"template": "print_range", "variables": {"n": ' + "9" * 5000 + "}}"
    reply = call_raw(server, "/runs", evil, huge)
    assert reply.status in (400, 422) and "\n" not in reply.body["error"], reply
    assert run_count() == before
    assert call(server, "GET", "/runs", evil).status == 200
    another_client_finishes()


HOLDER = """
import os, sys, time
from dtask import services
store = services.store()
with store.dispatch.turn(hold_for=float(sys.argv[1])) as turn:
    assert turn is not None
    print("in turn", flush=True)
    time.sleep(3600)
"""


def test_a_frozen_dispatcher_stops_dispatch_for_its_lease_only(
    dtask_env: dict[str, str], workers: list[WorkerProcess], tmp_path: Path
) -> None:
    """A process takes the dispatcher's turn as a worker's pass does, and is frozen (SIGSTOP)
    inside it. Before, its plain transaction held the turn until PostgreSQL's idle limit
    (60 s): no child of any run left. Now the workers' passes take over once it has sat idle
    for the lease (DTASK_LEASE_TTL, 8 s)."""
    lease = float(os.environ.get("DTASK_LEASE_TTL", "8"))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lease)],
        env=dtask_env, cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "in turn"
        os.kill(holder.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        dtask.set_client("bystander")
        run = dtask.submit("sum_squares", {"n": 3000}, client="bystander")
        status = run.wait(timeout=120)
        stopped = time.monotonic() - frozen_at
        print(f"dispatch stopped {stopped:.1f} s with the holder frozen (lease {lease:g} s)")
        assert status.state.value == "succeeded"
        assert stopped < lease + 20  # well below the 60 s idle limit that bounded it before
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
