"""The local stack: Flower's API with basic auth, and `dtask up` leaving nothing behind."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

import dtask
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support import ports
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

AUTH = "admin:s3cret-pw"


def get(url: str, auth: str | None = AUTH) -> Any:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        exc.close()  # it holds the connection open otherwise
        raise


def answers(url: str, auth: str) -> bool:
    try:
        get(url + "/api/workers", auth=auth)
    except (OSError, ValueError):
        return False
    return True


@pytest.fixture
def flower(dtask_env: dict[str, str], tmp_path: Path) -> Iterator[str]:
    from dtask.local.stack import free_port

    port = free_port(5599)
    log = (tmp_path / "flower.log").open("wb")
    proc = subprocess.Popen(
        [DTASK, "flower", "--port", str(port)],
        env={**dtask_env, "DTASK_FLOWER_AUTH": AUTH}, cwd=REPO, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    try:
        wait_for(partial(answers, url, AUTH), 30, "Flower to answer")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()
        assert AUTH.split(":")[1] not in (tmp_path / "flower.log").read_text()


def wait_until_flower_captures_events(flower: str) -> None:
    """Flower answers HTTP before its event thread is connected; events sent before are lost."""
    deadline = time.monotonic() + 90
    while True:
        probe = dtask.submit("print_range", {"n": 2000})
        probe.wait(timeout=60)
        # two children: a run of one child may show only as the pickup that ran it
        shown = f"print_range run {probe.id} "
        seen_by = time.monotonic() + 5
        while time.monotonic() < seen_by:
            tasks = get(flower + "/api/tasks?limit=1000").values()
            if any(str(t["args"]).startswith(shown) for t in tasks):
                return
            time.sleep(0.2)
        if time.monotonic() > deadline:
            raise AssertionError("Flower saw no task events in 90 s")


def test_flower_lists_workers_and_child_tasks_behind_basic_auth(
    flower: str, workers: list[WorkerProcess]
) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:
        get(flower + "/api/workers", auth=None)
    assert refused.value.code == 401
    wait_until_flower_captures_events(flower)

    ok = dtask.submit("print_range", {"n": 3000})
    bad = dtask.submit("always_fails", {"n": 20, "bad": 5})
    ok.wait(timeout=60)
    bad.wait(timeout=60)

    names = wait_for(lambda: list(get(flower + "/api/workers?refresh=1")), 30, "workers in Flower")
    assert len([n for n in names if n.startswith("dtask-")]) >= 2

    wanted = (f"print_range run {ok.id} child 0", f"always_fails run {bad.id} child 0")

    def child_tasks() -> dict[str, dict[str, Any]]:
        tasks = get(flower + "/api/tasks?limit=1000").values()
        finished = {
            t["args"]: t
            for t in tasks
            if t["name"] == "dtask.child" and t["state"] in ("SUCCESS", "FAILURE")
        }
        return finished if all(w in finished for w in wanted) else {}

    by_args = wait_for(child_tasks, 30, "the child tasks in Flower")
    assert by_args[f"print_range run {ok.id} child 0"]["state"] == "SUCCESS"
    assert by_args[f"print_range run {ok.id} child 0"]["kwargs"] == "{'a': 1, 'b': 1000}"
    failed = by_args[f"always_fails run {bad.id} child 0"]
    assert failed["state"] == "FAILURE"
    assert "item 5 is poison" in failed["exception"]


def dtask_processes(home: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            env = proc.environ() if str(home) not in cmdline else {}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if str(home) in cmdline or env.get("DTASK_HOME") == str(home):
            found.append(f"{proc.info['pid']} {cmdline[:120]}")
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_dtask_up_then_ctrl_c_leaves_no_process_behind(
    tmp_path: Path, dtask_env: dict[str, str], sig: signal.Signals
) -> None:
    home = tmp_path / "home"
    env = {**dtask_env, "DTASK_HOME": str(home)}
    out = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [DTASK, "up", "--workers", "2", "--flower-port", str(ports.free_port()),
         "--api-port", str(ports.free_port())],
        env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        log = tmp_path / "up.log"
        wait_for(lambda: "Ctrl-C stops everything" in log.read_text(), 90, "dtask up")
        text = log.read_text()
        assert "flower    http://127.0.0.1:" in text and "database  postgresql" in text
        assert "api       http://127.0.0.1:" in text
        assert len(dtask_processes(home)) >= 6  # 2 workers (+pools), beat, flower, api, pg, redis
        up.send_signal(sig)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
        out.close()
    time.sleep(0.5)
    assert dtask_processes(home) == []
    assert "dtask up: stopped" in (tmp_path / "up.log").read_text()


def test_the_demo_survives_its_sigkill_and_prints_plain_lines_without_a_tty(
    tmp_path: Path, dtask_env: dict[str, str]
) -> None:
    env = {**dtask_env, "DTASK_HOME": str(tmp_path / "home")}
    env.pop("DTASK_TEMPLATES")
    result = subprocess.run(
        [str(Path(DTASK).with_name("python")), "-m", "dtask.local.demo", "-n", "300000"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "run 1: succeeded" in out
    assert "printed    300,000 distinct numbers of 300,000" in out
    assert "demo: SIGKILL worker-" in out and "resumed" in out and "from its checkpoint" in out
    assert "\r" not in out and "\x1b" not in out
    assert dtask_processes(tmp_path / "home") == []


def test_flower_shows_a_cancelled_runs_children_in_a_final_state_and_masters_by_template(
    flower: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    wait_until_flower_captures_events(flower)
    run = dtask.submit("slow_range", {"n": 200, "delay": 0.2})  # 10 children of 4 s
    wait_for(lambda: run.status().children.running >= 2, 60, "children to start")
    run.cancel()
    assert run.wait(timeout=60).state is dtask.RunState.CANCELLED
    prefix = f"slow_range run {run.id} child "

    def settled() -> list[dict[str, Any]]:
        tasks = [
            t for t in get(flower + "/api/tasks?limit=2000").values()
            if str(t.get("args", "")).startswith(prefix)
        ]  # fmt: skip
        started = [t for t in tasks if t["state"] in ("STARTED", "RECEIVED")]
        return tasks if tasks and not started else []

    tasks = wait_for(settled, 60, "the cancelled run's children to end in Flower")
    states = {t["state"] for t in tasks}
    (tmp_path / "flower-cancelled.json").write_text(json.dumps(tasks, indent=1))
    print(f"\nFlower: {len(tasks)} child tasks of cancelled run {run.id}: {sorted(states)}")
    assert "REVOKED" in states and states <= {"REVOKED", "SUCCESS"}
    masters = [
        t for t in get(flower + "/api/tasks?limit=2000&taskname=dtask.master").values()
        if t.get("args", "").startswith(f"slow_range run {run.id} picked up")
    ]  # fmt: skip
    assert masters, "the master a pickup sent shows its template and run"


def test_a_local_flower_without_flower_auth_gets_a_private_password_never_an_open_api(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    """Flower without a password obeys any web page the operator's browser visits (a
    cross-site POST to /api/task/revoke): a local Flower gets a generated one instead."""
    from dtask.local.stack import free_port

    port = free_port(5601)
    env = {k: v for k, v in dtask_env.items() if k != "DTASK_FLOWER_AUTH"}
    log = (tmp_path / "flower.log").open("wb")
    proc = subprocess.Popen(
        [DTASK, "flower", "--port", str(port)], env=env, cwd=REPO, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    secret = Path(dtask_env["DTASK_HOME"]) / "flower-password"
    try:
        wait_for(secret.exists, 30, "the password file")
        assert secret.stat().st_mode & 0o777 == 0o600
        auth = "dtask:" + secret.read_text().strip()
        assert len(auth) > 20
        wait_for(partial(answers, url, auth), 30, "Flower to answer with the generated password")
        for method, path in (("GET", "/api/workers"), ("POST", "/api/task/revoke/x?terminate=1")):
            request = urllib.request.Request(
                url + path, method=method, data=b"" if method == "POST" else None
            )
            request.add_header("Origin", "https://evil.example")
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            refused.value.close()
            assert refused.value.code in (401, 403), (method, path)  # never obeyed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()
    assert secret.read_text().strip() not in (tmp_path / "flower.log").read_text()
