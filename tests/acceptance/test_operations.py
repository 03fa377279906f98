"""Operating runs end to end with real workers: cancel and rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import dtask
from dtask import services
from dtask.domain.runs import NewRun
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import children, wait_for

pytestmark = pytest.mark.acceptance


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )


def numbers(sink: Path, run_id: int, index: int) -> list[int]:
    path = sink / f"{run_id}-{index}.txt"
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_cancel_stops_running_children_at_a_checkpoint_and_rerun_resumes_them(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    # 10 children of 10 s: long enough that a busy machine's slow CLI and a heartbeat's delay
    # still catch them mid-way (with 4 s children the cancel sometimes came after they ended)
    run = dtask.submit("slow_range", {"n": 200, "delay": 0.5})
    wait_for(lambda: run.status().children.running >= 2, 30, "children to be running")
    time.sleep(1)

    cancelled = cli(dtask_env, "cancel", str(run.id), "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["state"] == "cancelled"
    again = cli(dtask_env, "cancel", str(run.id), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["state"] == "cancelled"

    wait_for(lambda: run.status().children.running == 0, 15, "running children to stop")
    stopped = run.status().children
    assert stopped.pending > 0
    time.sleep(3)
    assert run.status().children == stopped  # pending children never start
    partly_done = [i for i in range(10) if 0 < len(numbers(sink, run.id, i)) < 20]

    rerun = cli(dtask_env, "rerun", str(run.id), "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["state"] in ("splitting", "running")
    status = run.wait(timeout=90)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    for index in range(10):
        seen = numbers(sink, run.id, index)
        assert sorted(seen) == list(range(index * 20 + 1, index * 20 + 21)), index
    assert partly_done, "the cancel should have caught children mid-way"
    assert all(attempt == 1 for _, _, attempt in children(run.id))  # a stop is not an attempt


def test_rerun_of_a_failed_run_reruns_only_the_failed_child_from_its_checkpoint(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    store = services.store()
    run_id, _ = store.runs.create(
        NewRun("blocked_range", f"blocked-{time.time()}", {"n": 60}, 2, None)
    )
    (sink / f"block-{run_id}").touch()
    from dtask.worker import configure

    configure().send_task("dtask.master", args=(run_id,), ignore_result=True)
    run = dtask.get_run(run_id)
    failed = run.wait(timeout=60)
    assert failed.state is dtask.RunState.FAILED
    assert failed.children.failed == 1 and failed.children.succeeded == 2

    (sink / f"block-{run_id}").unlink()
    for w in workers:  # frozen: the rerun's child (ten items) cannot finish between the two
        os.killpg(w.proc.pid, signal.SIGSTOP)
    try:
        first, second = run.rerun(), run.rerun()  # the second finds the rerun under way
    finally:
        for w in workers:
            os.killpg(w.proc.pid, signal.SIGCONT)
    assert first.state in (dtask.RunState.SPLITTING, dtask.RunState.RUNNING)
    assert second.state in (dtask.RunState.SPLITTING, dtask.RunState.RUNNING)
    status = run.wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert status.error is None
    seen = numbers(sink, run_id, 0)
    assert set(seen) == set(range(1, 21))
    # two failed attempts before the rerun, each re-doing at most one checkpoint interval (5),
    # and the rerun resumed from the checkpoint instead of starting again at 1
    assert len(seen) - len(set(seen)) <= 2 * 5
    assert seen.count(1) == 1
    for index in (1, 2):  # the children that had succeeded were not run again
        assert numbers(sink, run_id, index) == list(range(index * 20 + 1, index * 20 + 21))

    done = cli(dtask_env, "rerun", str(run_id))
    assert done.returncode == 2 and "nothing to rerun" in done.stderr
    late = cli(dtask_env, "cancel", str(run_id))
    assert late.returncode == 2 and "already succeeded" in late.stderr
