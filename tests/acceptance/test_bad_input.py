"""Bad input and unreachable services: one actionable line, exit 2, nothing half-created."""

from __future__ import annotations

import subprocess

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from tests.conftest import DTASK, REPO
from tests.support import cli_batch
from tests.support.db import run_count

pytestmark = pytest.mark.acceptance


CASES: list[tuple[list[str], str]] = [
    (["submit", "nope"], "unknown template 'nope' (known: always_fails, "),
    (["submit", "print_range"], "template 'print_range' needs 'n'"),
    (["submit", "print_range", "-e", "n=abc"], "variable 'n' must be int, got 'abc'"),
    (["submit", "print_range", "-e", "n=-5"], "the range start=1 .. end=-5 is empty"),
    (["submit", "print_range", "-e", "n=5", "-e", "m=1"], "has no parameter 'm'"),
    (
        ["submit", "print_range", "-e", "n=1000000000"],
        "1,000,000 children, more than the maximum 100,000",
    ),
    (["submit", "print_range", "-e", "n"], "-e/--var expects NAME=VALUE"),
    (["submit", "free_form", "-e", "steps=51"], "'steps' must be <= 50"),
    (
        ["submit", "print_range", "-e", "n=5", "--execution-cap", "0"],
        "execution cap must be over 0 and at most 315,360,000 seconds, got 0.0",
    ),
    (
        ["submit", "print_range", "-e", "n=5", "--execution-cap", "-3"],
        "execution cap must be over 0 and at most 315,360,000 seconds, got -3.0",
    ),
    (
        ["submit", "print_range", "-e", "n=5", "--execution-cap", "soon"],
        "--execution-cap expects a number of seconds, got 'soon'",
    ),
    (["status", "987654"], "no run with id 987654"),
    (["token", "create", "--client", "nobody-here"], "no client named 'nobody-here'"),
    (["token", "revoke", "987654"], "no token with id 987654"),
    (["worker", "--tier", "gold"], "tier must be one of basic, regular, premium, got 'gold'"),
    (["submit", "print_range", "-e", "n=5", "--tier", "gold"], "invalid choice: 'gold'"),
    (["status", "abc"], "argument run_id: 'abc' is not a run id"),
    (
        ["submit", "print_range", "-e", "n=5", "--key", "k" * 301],
        "the key is 301 characters, over the limit of 300",
    ),
    (
        ["submit", "print_range", "-e", "n=5", "--key", "schedule:nightly:2026-11-24"],
        "keys starting with 'schedule:' are reserved for schedule slots",
    ),
    (["runs", "--limit", "-1"], "argument --limit: '-1' is not a positive whole number"),
    (["runs", "--limit", "1e20"], "argument --limit: '1e20' is not a positive whole number"),
    (
        [
            "schedule",
            "add",
            "x2",
            "print_range",
            "-e",
            "n=1",
            "--every",
            "5",
            "--tz",
            "A" * 300,
        ],
        "unknown time zone 'AAAA",
    ),
    (
        [
            "schedule",
            "add",
            "x3",
            "print_range",
            "-e",
            "n=1",
            "--every",
            "5",
            "--start",
            "9999-12-31T23:59:59",
        ],
        "start and end must lie between 1970 and 8999, got 9999-12-31T23:59:59+00:00",
    ),
    (
        ["schedule", "add", "x4", "print_range", "-e", "n=1", "--cron", "* " * 150],
        "a cron expression is at most 200 characters, got 300",
    ),
    (
        ["submit", "print_range", "-e", "n=5", "--wait", "--timeout", "nan"],
        "argument --timeout: 'nan' is not a number of seconds (0 to 31,622,400)",
    ),
    (["status", "1", "--watch", "--timeout", "nan"], "argument --timeout: 'nan' is not a"),
    (["flower", "--port", "70000"], "argument --port: '70000' is not a TCP port (1 to 65,535)"),
    (["up", "--flower-port", "70000"], "argument --flower-port: '70000' is not a TCP port"),
    (
        ["up", "--flower-port", "17777", "--api-port", "17777"],
        "--flower-port and --api-port are both 17777: give them different ports",
    ),
    (["schedule", "show", "a\x01b"], "no schedule named 'a\\x01b'"),
    (["frobnicate"], "invalid choice"),
    (["worker", "--bogus"], "worker: No such option"),  # Celery's own options: last, it
    # installs the worker's signal handlers in the process that runs the cases
]


@pytest.fixture(scope="module")
def outcomes(dtask_env: dict[str, str]) -> tuple[int, list[cli_batch.Outcome]]:
    """Every case's command, run in one process (tests/support/cli_batch.py), and the number
    of runs before them."""
    return run_count(), cli_batch.run_all(dtask_env, [args for args, _ in CASES])


@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(a)[:40] for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(
    outcomes: tuple[int, list[cli_batch.Outcome]], case: int
) -> None:
    before, done = outcomes
    message, result = CASES[case][1], done[case]
    assert result.code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.runs == before


def test_bad_input_from_the_console_script_is_one_line_exit_2(dtask_env: dict[str, str]) -> None:
    before = run_count()
    args, message = CASES[2]
    result = subprocess.run([DTASK, *args], env=dtask_env, cwd=REPO, capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (2, f"dtask: error: {message}\n")
    assert run_count() == before


def test_hostile_values_from_python_are_refused_and_create_nothing(
    dtask_env: dict[str, str],
) -> None:
    before = run_count()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(dtask.InvalidVariables, match="'delay' must be a finite number"):
            dtask.submit("slow_range", {"n": 5, "delay": bad})
    with pytest.raises(dtask.InvalidVariables, match="variable 'what' holds a NUL character"):
        dtask.submit("returns", {"n": 5, "what": "a\x00b"})
    with pytest.raises(dtask.InvalidVariables, match=r"is 5,242,89\d bytes of JSON, over the lim"):
        dtask.submit("returns", {"n": 5, "what": "x" * (5 * 1024 * 1024)})
    with pytest.raises(dtask.InvalidStart, match="the key holds a NUL character"):
        dtask.submit("print_range", {"n": 5}, key="a\x00b")
    assert run_count() == before


def test_a_bad_execution_cap_from_python_creates_nothing(dtask_env: dict[str, str]) -> None:
    before = run_count()
    for bad in (0, -1, "5", None.__class__):
        with pytest.raises(dtask.InvalidExecutionCap, match="run of template 'print_range'"):
            dtask.submit("print_range", {"n": 5}, execution_cap=bad)  # type: ignore[arg-type]
        with pytest.raises(dtask.InvalidExecutionCap, match="run of template 'print_range'"):
            dtask.registry.get("print_range").submit({"n": 5}, execution_cap=bad)  # type: ignore[arg-type]
    assert run_count() == before
    run = dtask.registry.get("print_range").submit({"n": 5}, execution_cap=7.5)
    with services.store().engine.connect() as conn:
        stored = conn.execute(
            text("SELECT execution_cap FROM dtask_runs WHERE id = :id"), {"id": run.id}
        ).scalar_one()
    assert stored == 7.5  # the run's own cap, read by the claim
    run.cancel()  # no worker of a later test prints its numbers


def test_a_too_large_split_is_also_configurable(dtask_env: dict[str, str]) -> None:
    env = {**dtask_env, "DTASK_MAX_CHILDREN": "5"}
    result = subprocess.run(
        [DTASK, "submit", "print_range", "-e", "n=6000"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2 and "6 children, more than the maximum 5" in result.stderr


def test_broker_down_at_submit_leaves_no_run(dtask_env: dict[str, str]) -> None:
    before = run_count()
    env = {
        **dtask_env,
        "DTASK_DATABASE_URL": services.database_url(),
        "DTASK_BROKER_URL": "redis://127.0.0.1:1/0",
    }
    result = subprocess.run(
        [DTASK, "submit", "print_range", "-e", "n=10"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot reach the broker at redis://127.0.0.1:1/0" in result.stderr
    assert "no run was created" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert run_count() == before


def test_database_down_is_one_line(dtask_env: dict[str, str]) -> None:
    env = {
        **dtask_env,
        "DTASK_DATABASE_URL": "postgresql+psycopg://dtask:s3cret@127.0.0.1:1/dtask",
        "DTASK_BROKER_URL": services.current().broker_url,
    }
    for args in (["submit", "print_range", "-e", "n=10"], ["runs"], ["status", "1"]):
        result = subprocess.run([DTASK, *args], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, args
        assert (
            "cannot reach PostgreSQL at postgresql+psycopg://dtask:***@127.0.0.1:1/dtask"
            in result.stderr
        )
        assert "s3cret" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
