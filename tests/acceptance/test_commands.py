"""Command templates with real workers (docs/commands.md): a shell script run per child from a
TOML file (tests/support/commands/), resumed from its checkpoint on another worker when its
worker is SIGKILLed, leaving no orphaned command behind; variables reach it as literal
arguments; a non-zero exit fails the attempt with its code and the end of its stderr."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.templating import command_templates
from soak.cluster import FAST
from tests.conftest import DTASK, REPO, WorkerProcess, running_workers
from tests.support.db import child_row, owner_pid, wait_for

pytestmark = pytest.mark.acceptance
JOBS = REPO / "tests" / "support" / "commands" / "jobs.toml"


@pytest.fixture(scope="module")
def workers(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    command_templates.load(JOBS)  # this process submits them: it knows them too
    env = {**dtask_env, **FAST, "DTASK_TEMPLATES": f"{dtask_env['DTASK_TEMPLATES']},{JOBS}"}
    with running_workers(env, tmp_path_factory.mktemp("commands"), 2, "-c", "2") as started:
        yield started


def numbers(sink: Path, run_id: int) -> Counter[int]:
    return Counter(int(x) for f in sink.glob(f"{run_id}-*.txt") for x in f.read_text().split())


def commands_of(run_id: int, index: int) -> list[psutil.Process]:
    """Live processes running the script for that child (its environment names it)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("DTASK_RUN_ID") == str(run_id) and env.get("DTASK_CHILD_INDEX") == str(index):
            found.append(proc)
    return found


def test_a_sigkilled_workers_command_dies_with_it_and_resumes_from_its_checkpoint(
    workers: list[WorkerProcess], sink: Path
) -> None:
    run = dtask.submit("count_cmd", {"n": 800})  # two children of 400 numbers, ~9 s each
    owner = wait_for(
        lambda: (r := child_row(run.id, 0)).checkpoint is not None and r.owner, 60,
        "child 0 to checkpoint",
    )  # fmt: skip
    victim = next(w for w in workers if os.getpgid(owner_pid(owner)) == w.proc.pid)
    running = [p.pid for p in commands_of(run.id, 0)]
    assert running, "its command runs"
    os.killpg(victim.proc.pid, signal.SIGKILL)
    victim.proc.wait(10)
    # the command is in a session of its own (a drain's SIGTERM reaches its children): the
    # killed pool process takes it along all the same (PR_SET_PDEATHSIG). An orphan would go
    # on until it next writes to its closed stdout, a checkpoint (100 numbers, ~2 s) away.
    wait_for(lambda: not any(alive(p) for p in running), 1.0, "no orphan")
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen = numbers(sink, run.id)
    assert sorted(seen) == list(range(1, 801))
    assert sum(c - 1 for c in seen.values()) <= 100  # at most a checkpoint's worth again
    assert child_row(run.id, 0).attempt == 2
    assert results(run.id) == [{"count": 400}] * 2  # each command's ::result line


@pytest.mark.parametrize("tag", ["; rm -rf /", "$(touch /tmp/dtask-owned) `id`"])
def test_a_variable_reaches_the_script_as_one_literal_argument(
    workers: list[WorkerProcess], sink: Path, tag: str
) -> None:
    status = dtask.submit("count_cmd", {"n": 4, "tag": tag}).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert (sink / f"{status.id}-0.tag").read_text() == tag
    assert not Path("/tmp/dtask-owned").exists()


def test_a_non_zero_exit_shows_its_code_and_stderr_in_dtask_status(
    workers: list[WorkerProcess], sink: Path
) -> None:
    status = dtask.submit("count_cmd", {"n": 10, "fail": 3}).wait(timeout=60)
    assert status.state is dtask.RunState.FAILED
    shown = subprocess.run(
        [DTASK, "status", str(status.id)], capture_output=True, text=True, check=False
    ).stdout
    assert "the command exited with code 3" in shown, shown
    assert "number 3 is bad" in shown, shown
    assert child_row(status.id, 0).attempt == 2  # retried, then failed for good


def test_the_last_lines_a_command_printed_are_kept_with_its_success(
    workers: list[WorkerProcess],
) -> None:
    status = dtask.submit("count_cmd", {"n": 60}).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    shown = subprocess.run(
        [DTASK, "status", str(status.id), "--child", "1"], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip
    assert "the last lines its success printed:" in shown, shown
    kept = [line.strip() for line in shown.split("printed:\n", 1)[1].splitlines()]
    # all its 31 lines: within DTASK_MAX_CHILD_LOG (test_child_logs bounds a longer one)
    assert kept == [f"number {i}" for i in range(31, 61)] + ["counted 31..60"], shown


def alive(pid: int) -> bool:
    """Running (a zombie is dead: this sandbox's init may reap it late)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def results(run_id: int) -> list[object]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT result FROM dtask_children WHERE run_id = :r ORDER BY index"),
            {"r": run_id},
        )
        return [r.result for r in rows]


def test_dtask_templates_lists_them_and_a_wrong_file_is_one_line(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**dtask_env, "DTASK_TEMPLATES": str(JOBS)}
    listed = subprocess.run(
        [DTASK, "templates"], env=env, cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "count_cmd" in listed
    wrong = tmp_path / "jobs.toml"
    wrong.write_text(JOBS.read_text().replace("max_attempts = 2", "max_atempts = 2"))
    failed = subprocess.run(
        [DTASK, "templates"], env={**env, "DTASK_TEMPLATES": str(wrong)}, cwd=REPO,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert failed.returncode != 0
    lines = failed.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown key 'max_atempts'" in lines[0], failed.stderr
    assert str(wrong) in lines[0]
