"""A hostile client against command templates on real workers (docs/security.md): a client
token's variable never runs on a worker nor reads its settings, one line of a gigabyte costs
a pool process nothing and keeps its lease, and whatever a command started ends with it, on
a SIGKILLed pool process, a cancel and a cancel --terminate."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import dtask
from dtask.templating import command_templates
from soak.cluster import FAST
from tests.conftest import DTASK, REPO, WorkerProcess, running_workers
from tests.support.api import call, start_server, token
from tests.support.db import child_row, owner_pid, wait_for

pytestmark = pytest.mark.acceptance
HOSTILE = REPO / "tests" / "support" / "commands" / "hostile.toml"
LINE_MB = int(os.environ.get("DTASK_TEST_LINE_MB", "300"))  # 1024: the measure


@pytest.fixture(scope="module")
def env(dtask_env: dict[str, str]) -> dict[str, str]:
    command_templates.load(HOSTILE)  # this process submits them: it knows them too
    return {**dtask_env, **FAST, "DTASK_TEMPLATES": f"{dtask_env['DTASK_TEMPLATES']},{HOSTILE}"}


@pytest.fixture(scope="module")
def workers(
    env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    with running_workers(env, tmp_path_factory.mktemp("hostile"), 1, "-c", "2") as started:
        yield started


def test_a_client_tokens_variable_never_runs_on_a_worker_nor_reads_its_settings(
    workers: list[WorkerProcess], env: dict[str, str], sink: Path, tmp_path: Path
) -> None:
    server, base = start_server(env, tmp_path / "serve.log")
    try:
        subprocess.run(
            [DTASK, "client", "set", "mallory"], env=env, capture_output=True, check=True
        )
        mine = token(env, "mallory")
        owned = sink / "owned"
        name = f'$(touch {owned})`touch {owned}`"; touch {owned}; "$DTASK_DATABASE_URL'
        made = call(
            base, "POST", "/runs", mine, {"template": "greet_sh", "variables": {"name": name}}
        )
        assert made.status == 201, made.body
    finally:
        server.stop()
    run_id = made.body["id"]
    status = dtask.get_run(run_id).wait(timeout=60)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert (sink / f"greet-{run_id}.txt").read_text() == f"hello {name}\n"
    assert not owned.exists()
    seen = (sink / f"env-{run_id}.txt").read_text()
    settings = sorted(set(re.findall(r"^(DTASK_[A-Z_]+)=", seen, re.M)))
    assert settings == ["DTASK_ATTEMPT", "DTASK_CHECKPOINT", "DTASK_CHILD_INDEX",
                        "DTASK_PROTOCOL_FD", "DTASK_RUN_ID", "DTASK_TEST_SINK"]  # fmt: skip
    for secret in ("DTASK_DATABASE_URL", "DTASK_BROKER_URL", "DTASK_RESULT_BACKEND"):
        value = env.get(secret)
        assert not value or value not in seen, secret


def test_one_huge_line_costs_its_pool_process_little_and_keeps_its_lease(
    workers: list[WorkerProcess],
) -> None:
    log = workers[0].log
    logged = log.stat().st_size
    run = dtask.submit("long_line", {"mb": LINE_MB})
    owner = wait_for(lambda: child_row(run.id, 0).owner, 60, "the child to start")
    pool = psutil.Process(owner_pid(owner))
    status = run.wait(timeout=300)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    assert child_row(run.id, 0).attempt == 1  # its lease never lost
    peak = _peak_rss(pool.pid)
    grown = log.stat().st_size - logged
    print(f"a {LINE_MB} MiB line: pool process peak RSS {peak / 2**20:.0f} MiB, log +{grown:,} B")
    assert peak < 200 * 2**20
    assert grown < 2**20
    shown = subprocess.run(
        [DTASK, "logs", str(run.id), "--child", "0"], capture_output=True, text=True, check=True
    ).stdout
    assert "[line cut: " in shown and "done" in shown, shown[-500:]


def _peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1)) * 1024  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["sigkill", "cancel", "terminate"])
def test_every_process_a_command_started_ends_with_it(
    workers: list[WorkerProcess], sink: Path, how: str
) -> None:
    """A process ignoring SIGTERM and one that called setsid: both gone within the grace (1 s)
    and 2 s of the stop reaching the worker (the heartbeat's 0.5 s for a cancel)."""
    run = dtask.submit("tree", {})
    pids = wait_for(lambda: _tree(sink, run.id), 60, "the command's processes")
    owner = child_row(run.id, 0).owner
    stopped = time.monotonic()
    if how == "sigkill":
        os.kill(owner_pid(owner), signal.SIGKILL)
    else:
        flags = ["--terminate"] if how == "terminate" else []
        subprocess.run([DTASK, "cancel", str(run.id), *flags], check=True, capture_output=True)
    try:
        wait_for(lambda: not any(_alive(p) for p in pids), 30, "the whole tree to end")
        print(f"{how}: the tree ended {time.monotonic() - stopped:.2f} s after the stop")
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if how == "sigkill":
            dtask.get_run(run.id).cancel()


def _tree(sink: Path, run_id: int) -> list[int] | None:
    found = [p.read_text().strip() for p in sink.glob(f"tree-{run_id}.*.pid")]
    return [int(p) for p in found] if len(found) == 2 and all(found) else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
