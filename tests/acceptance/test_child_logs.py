"""Children you can see into (issue 42): each attempt keeps its last DTASK_MAX_CHILD_LOG
characters of output (stdout, stderr, ctx.log) in PostgreSQL with the worker that ran it;
`dtask logs` shows them, follows a running child, and says what was not kept."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import dtask
from dtask import services
from tests.conftest import DTASK, REPO, WorkerProcess, running_workers
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance
LIMIT = 2000  # DTASK_MAX_CHILD_LOG of these workers and commands


@pytest.fixture(scope="module")
def env(dtask_env: dict[str, str]) -> dict[str, str]:
    return {**dtask_env, "DTASK_MAX_CHILD_LOG": str(LIMIT), "DTASK_HEARTBEAT_INTERVAL": "0.5"}


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with running_workers(env, tmp_path_factory.mktemp("logs"), 1, "-c", "2") as [one]:
        yield one


def logs(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, "logs", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def chatty(n: int = 1, lines: int = 3, every: float = 0.0, fail_first: int = 0) -> dtask.Run:
    return dtask.submit(
        "chatty", {"n": n, "lines": lines, "every": every, "fail_first": fail_first}
    )


def test_each_attempt_keeps_its_output_and_worker(
    worker: WorkerProcess, env: dict[str, str]
) -> None:
    run = chatty(fail_first=1)
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    shown = json.loads(logs(env, str(run.id), "--child", "0", "--json").stdout)
    assert [(a["attempt"], a["state"]) for a in shown] == [(1, "failed"), (2, "succeeded")]
    host = socket.gethostname()
    assert all(a["worker"].startswith(f"{host}:") for a in shown), shown
    first, second = (a["output"] for a in shown)
    for attempt, text in ((1, first), (2, second)):
        assert f"child 1 attempt {attempt} starts\n" in text
        assert f"child 1 attempt {attempt} on stderr\n" in text
        assert f"WARNING child 1 attempt {attempt} logs\n" in text
        assert text.count(f"child 1 attempt {attempt} logs") == 1, text  # not the log's too
        assert f"line 2 of attempt {attempt}\n" in text
    assert "fails on purpose" in shown[0]["error"] and shown[1]["error"] is None
    assert second.endswith("child 1 attempt 2 ends\n")
    printed = logs(env, str(run.id), "--child", "0").stdout
    assert f"--- child 0, attempt 1 on {host}:" in printed and ", failed: RuntimeError:" in printed
    assert f"--- child 0, attempt 2 on {host}:" in printed
    # the worker that ran it, also after it finished (its lease's owner is cleared then)
    [child] = services.store().children.page(run.id, None, 10, None)
    assert child.worker == shown[1]["worker"]


def test_the_output_kept_is_bounded_and_says_what_was_not(
    worker: WorkerProcess, env: dict[str, str]
) -> None:
    run = chatty(lines=2000)  # about 40,000 characters
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    [attempt] = json.loads(logs(env, str(run.id), "--child", "0", "--json").stdout)
    assert len(attempt["output"]) == LIMIT
    assert attempt["output"].endswith("line 1999 of attempt 1\nchild 1 attempt 1 ends\n")
    failed = chatty(lines=2000, fail_first=1)
    failed.wait(timeout=120)
    first = json.loads(logs(env, str(failed.id), "--child", "0", "--json").stdout)[0]
    assert len(first["output"]) == LIMIT and first["skipped"] > 30_000
    assert "earlier characters not kept" in logs(env, str(failed.id), "--child", "0").stdout


def test_follow_prints_a_running_child_s_lines_as_they_come(
    worker: WorkerProcess, env: dict[str, str], tmp_path: Path
) -> None:
    run = chatty(lines=30, every=0.2)  # 6 s, a dozen heartbeats
    out = (tmp_path / "follow.out").open("w+")
    follow = subprocess.Popen(
        [DTASK, "logs", str(run.id), "--follow"], env=env, cwd=REPO, stdout=out, text=True
    )
    try:
        wait_for(lambda: "line 3 of attempt 1" in Path(out.name).read_text(), 120, "a line")
        assert not run.ready()  # seen while the child still ran
        assert follow.wait(timeout=120) == 0
    finally:
        follow.kill()
        out.close()
    text = Path(out.name).read_text()
    lines = [f"line {i} of attempt 1" for i in range(30)]
    assert [line for line in text.splitlines() if line.startswith("line ")] == lines
    assert text.count("child 1 attempt 1 ends") == 1


def test_a_run_s_logs_and_bad_input(worker: WorkerProcess, env: dict[str, str]) -> None:
    run = chatty(n=3)
    run.wait(timeout=120)
    text = logs(env, str(run.id)).stdout
    assert [line.split(",")[0] for line in text.splitlines() if line.startswith("---")] == [
        "--- child 0", "--- child 1", "--- child 2"
    ]  # fmt: skip
    missing = logs(env, str(run.id), "--child", "7")
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == f"dtask: error: run {run.id} has no child 7 (see `dtask children`)"
    )
    assert logs(env, "999999").returncode == 2
