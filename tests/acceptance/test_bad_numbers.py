"""Issue 58, items 9 and 10, as a caller meets them: an integer past any float for a float
parameter over HTTP (a run and a batch) and in a `submit --from` file, and the four command
lines the fuzz found tracebacks in. Each is one line (or one JSON error) and creates nothing;
a `--from` file is checked whole before its first run is written, and an error after that says
which lines have their runs and which were not submitted."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.exceptions import DatabaseUnavailable
from tests.conftest import DTASK, REPO
from tests.integration.test_hostile_input import call as cli
from tests.integration.test_hostile_input import counts
from tests.support.api import call, call_raw, start_server, token
from tests.support.db import run_count

pytestmark = pytest.mark.acceptance

BIG = "1" + "0" * 400  # 10**400 as JSON text: past any float
PAST_FLOAT = "variable 'delay' must be a finite number, got an integer of 401 digits"


@pytest.fixture(scope="module")
def api(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    dtask.set_client("bn-http")
    proc, base = start_server(dtask_env, tmp_path_factory.mktemp("bn") / "serve.log")
    try:
        yield base, token(dtask_env, "bn-http")
    finally:
        proc.stop()
        assert "Traceback" not in proc.output()


def test_http_an_integer_past_any_float_is_a_422_naming_the_parameter(api: Any) -> None:
    base, client = api
    before = run_count()
    one = '{"template": "slow_range", "variables": {"n": 1, "delay": ' + BIG + "}}"
    reply = call_raw(base, "/runs", client, one)
    assert reply.status == 422, reply
    assert reply.body == {"error": PAST_FLOAT, "fields": {"delay": PAST_FLOAT}}
    past_bigint = {"template": "slow_range", "variables": {"n": 2**63, "delay": 0}}
    reply = call(base, "POST", "/runs", client, past_bigint)
    assert reply.status == 422 and "variable 'n' must be an int from" in reply.body["error"]
    assert run_count() == before

    runs = f'[{{"variables": {{"n": 1, "delay": {BIG}}}}}, {{"variables": {{"n": 1, "delay": 0}}}}]'
    reply = call_raw(base, "/runs/batch", client, f'{{"template": "slow_range", "runs": {runs}}}')
    assert reply.status == 200, reply  # a batch answers each run's outcome (docs/api.md)
    first, second = reply.body["runs"]
    assert (first["outcome"], first["error"]) == ("invalid", PAST_FLOAT)
    assert second["outcome"] == "created"
    assert run_count() == before + 1


def _lines(path: Path, stamp: str, count: int, bad_at: int | None = None) -> None:
    rows = [
        json.dumps({"variables": {"n": 1, "delay": 0}, "key": f"{stamp}-{i}"})
        for i in range(1, count + 1)
    ]
    if bad_at is not None:
        rows[bad_at - 1] = '{"variables": {"n": 1, "delay": ' + BIG + "}}"
    path.write_text("\n".join(rows) + "\n")


def _keyed(stamp: str) -> list[int]:
    with services.store().engine.connect() as conn:
        found = conn.execute(
            text("SELECT id FROM dtask_runs WHERE trigger_key LIKE :k ORDER BY id"),
            {"k": f"{stamp}-%"},
        ).scalars()
        return [int(i) for i in found]


def test_from_a_file_with_a_bad_line_creates_nothing_and_names_the_line(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    stamp = f"bn-{time.time_ns()}"
    path = tmp_path / "runs.jsonl"
    _lines(path, stamp, 1001, bad_at=1001)  # its first 1,000 lines make a whole chunk
    done = subprocess.run(
        [DTASK, "submit", "slow_range", "--from", str(path)], env=dtask_env, cwd=REPO,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"line 1001: invalid: {PAST_FLOAT}",
        "dtask: error: 1 of 1,001 lines are no runs: nothing was submitted; fix them and submit"
        " the file again",
    ]
    assert _keyed(stamp) == []


def test_from_names_the_first_twenty_bad_lines_and_json_lists_each(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text('{"n": 1, "delay": "x"}\n' * 25 + '{"n": 1, "delay": 0}\n' * 5)
    before = run_count()
    shown = subprocess.run(
        [DTASK, "submit", "slow_range", "--from", str(path), "--json"], env=dtask_env,
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 2, shown.stderr
    assert [r["line"] for r in json.loads(shown.stdout)] == list(range(1, 26))
    said = shown.stderr.splitlines()
    assert len(said) == 21
    assert said[0] == "line 1: invalid: variable 'delay' must be float, got str 'x'"
    assert said[-1] == (
        "dtask: error: 25 of 30 lines are no runs (5 more not shown): nothing was submitted;"
        " fix them and submit the file again"
    )
    assert run_count() == before


@pytest.mark.parametrize(
    ("stop", "says", "code"),
    [
        (DatabaseUnavailable("no PostgreSQL (the test's)"), "no PostgreSQL (the test's)", 2),
        (KeyboardInterrupt(), "interrupted", 130),
        (RuntimeError("a bug"), "RuntimeError: a bug", 2),
    ],
    ids=["database", "ctrl-c", "bug"],
)
def test_from_stopped_after_a_chunk_names_the_lines_that_have_their_runs(
    dtask_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stop: BaseException,
    says: str,
    code: int,
) -> None:
    stamp = f"bn-{time.time_ns()}"
    path = tmp_path / "runs.jsonl"
    _lines(path, stamp, 1500)
    runs = type(services.store().runs)
    create, chunks = runs.create_runs, []

    def second_fails(self: Any, new: Any) -> Any:
        chunks.append(len(new))
        if len(chunks) == 2:
            raise stop
        return create(self, new)

    monkeypatch.setattr(runs, "create_runs", second_fails)
    exit_code, err = cli("submit", "slow_range", "--from", str(path))
    monkeypatch.undo()
    ids = _keyed(stamp)
    assert len(ids) == 1000 and ids == list(range(ids[0], ids[0] + 1000))
    assert (exit_code, err.splitlines()) == (
        code,
        [
            f"dtask: error: {says}: lines 1-1000 have their runs"
            f" (runs {ids[0]}-{ids[-1]}); lines 1001-1500 were not submitted"
        ],
    ), err
    again, err = cli("submit", "slow_range", "--from", str(path))  # the rest, nothing twice
    assert again == 0, err
    assert len(_keyed(stamp)) == 1500


N400 = "9" * 400


@pytest.mark.parametrize(
    ("argv", "env", "says"),
    [
        (
            ["submit", "print_range", "-e", "n=3", "--notify-url", "http://[::1"],
            {},
            "notify_url must be an http(s) URL",
        ),
        (
            ["runs"],
            {"DTASK_DATABASE_URL": "postgresql+psycopg://u:p@[::1/x"},
            "DTASK_DATABASE_URL='postgresql+psycopg://u:***@[::1/x' has a bad host: an IPv6",
        ),
        (
            ["schedule", "add", "bn-every", "print_range", "-e", "n=1", "--every", N400],
            {},
            "an interval must be 1 to 31622400 seconds, got an integer of 400 digits",
        ),
        (
            ["client", "set", "bn-rate", "--rate", "9" * 4301 + "/m"],
            {},
            "rate must look like N/PERIOD with N from 1 to 2,147,483,647",
        ),
        (
            ["submit", "slow_range", "-e", "n=1", "-e", f"delay={BIG}"],
            {},
            f"variable 'delay' must be a finite number, got '{BIG[:20]}",
        ),
    ],
    ids=["notify-url", "database-url", "every", "rate", "delay"],
)
def test_each_command_line_the_fuzz_found_a_traceback_in_is_one_line(
    dtask_env: dict[str, str], argv: list[str], env: dict[str, str], says: str
) -> None:
    before = counts()
    done = subprocess.run(
        [DTASK, *argv], env={**dtask_env, **env}, cwd=REPO,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("dtask: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert says in done.stderr
    assert counts() == before


def test_dtask_worker_help_starts_no_service(tmp_path: Path) -> None:
    """Before, `dtask worker --help` ran initdb and left PostgreSQL and Redis running."""
    import os

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    shown = subprocess.run(
        [DTASK, "worker", "--help"], env={**env, "DTASK_HOME": str(home)}, cwd=REPO,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "Usage: dtask worker" in shown.stdout
    assert not home.exists()
