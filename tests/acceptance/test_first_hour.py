"""What a newcomer trips over in the first hour: each answered in one line, never a
traceback (issue 19)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dtask
from dtask import services
from tests.acceptance.test_core import cli
from tests.conftest import DTASK, REPO, WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def one_line(result: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    assert says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_small_mistakes_get_one_line(dtask_env: dict[str, str]) -> None:
    one_line(
        cli(dtask_env, "submit", "print_range", "-e", "n=\uff11\uff12"), 2,
        "variable 'n' must be int, got '\uff11\uff12'",
    )  # fmt: skip
    one_line(
        cli(dtask_env, "submit", "print_range", "-e", "n=5", "--key", " "), 2,
        "the key is empty (leave it out for an ad hoc run)",
    )  # fmt: skip
    one_line(cli(dtask_env, "drain", "worker-9"), 2, "no worker 'worker-9' answered")
    with pytest.raises(dtask.RunNotFound, match="a run id is an integer"):
        dtask.get_run("abc")  # type: ignore[arg-type]


def test_a_template_module_found_in_the_current_folder_and_its_syntax_error_in_one_line(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "myjobs.py").write_text(
        textwrap.dedent(
            """
            import dtask

            @dtask.template("cube_sum", params={"n": int}, skeleton={"n": "${n}"},
                            split=lambda r: [{"n": r["n"]}])
            def cube_sum(ctx, n):
                return n ** 3
            """
        )
    )
    env = {**dtask_env, "DTASK_TEMPLATES": "myjobs"}
    env.pop("PYTHONPATH", None)
    found = subprocess.run(
        [DTASK, "templates"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert found.returncode == 0 and "cube_sum" in found.stdout, found.stderr
    without = {k: v for k, v in env.items() if k != "DTASK_TEMPLATES"}
    for argv in (["templates", "--templates", "myjobs"], ["--templates=myjobs", "templates"]):
        named = subprocess.run(
            [DTASK, *argv], cwd=tmp_path, env=without, capture_output=True, text=True, timeout=60
        )
        assert named.returncode == 0 and "cube_sum" in named.stdout, named.stderr
    for module, code, says in (
        ("broken", "def oops(:\n", "which has a syntax error"),
        ("raising", "import os\nos.environ['MYJOBS_TOKEN']\n", "which raised KeyError as it"),
    ):
        (tmp_path / f"{module}.py").write_text(code)
        done = subprocess.run(
            [DTASK, "templates"], cwd=tmp_path, env={**env, "DTASK_TEMPLATES": module},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        one_line(done, 2, f"DTASK_TEMPLATES names {module!r}, {says}")
        assert f"{module}.py:" in done.stderr  # the line to fix


def test_a_template_defined_in_the_script_being_run_is_refused(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import dtask

            @dtask.template("in_main", params={"n": int}, skeleton={"n": "${n}"},
                            split=lambda r: [{"n": r["n"]}])
            def in_main(ctx, n):
                return n

            try:
                in_main.delay(n=1)
            except dtask.TemplateDefinitionError as exc:
                print(exc)
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], env=dtask_env, capture_output=True, text=True, timeout=60
    )
    assert "defined in the script being run (__main__)" in result.stdout, result.stderr


def test_ctrl_c_while_waiting_says_how_to_follow_or_cancel_the_run(
    dtask_env: dict[str, str],
) -> None:
    proc = subprocess.Popen(
        [DTASK, "submit", "print_range", "-e", "n=5", "--wait"], env=dtask_env, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_on_a_terminal,
    )  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()  # "run N submitted": it waits from here on
    assert first.endswith("submitted\n"), first
    out, err = _interrupt(proc)
    assert proc.returncode == 130, (out, err)
    run_id = _latest_print_range_pending()
    assert f"run {run_id} goes on: `dtask status {run_id} --watch` follows it" in err
    assert "Traceback" not in err
    dtask.get_run(run_id).cancel()


def test_sigusr1_prints_where_a_waiting_command_is_and_it_waits_on(
    dtask_env: dict[str, str],
) -> None:
    proc = subprocess.Popen(
        [DTASK, "submit", "print_range", "-e", "n=5", "--wait"], env=dtask_env, cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_as_on_a_terminal,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline().endswith("submitted\n")
        proc.send_signal(signal.SIGUSR1)
        lines = [proc.stderr.readline() for _ in range(3)]
        assert any(line.startswith(("Current thread", "Thread 0x")) for line in lines), lines
        assert proc.poll() is None  # still waiting
    finally:
        _interrupt(proc)
    assert proc.returncode == 130
    run_id = _latest_print_range_pending()
    if run_id is not None:
        dtask.get_run(run_id).cancel()


def _interrupt(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C, and its output once it has exited; where it has not within 60 s, where each of
    its threads is (SIGUSR1) goes into the failure."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)  # faulthandler writes from the signal handler, at once
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running 60 s after Ctrl-C:\n{err[-6000:]}") from None
    finally:
        proc.kill()  # no-op once it has exited; otherwise its pipes would outlive the test
        proc.communicate()


def _as_on_a_terminal() -> None:
    """Ctrl-C reaches a command typed at a terminal; a test run started in the background
    (`make test &`) ignores SIGINT, and so would the command, which then never stops."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _latest_print_range_pending() -> int | None:
    latest = [s for s in services.store().runs.statuses(limit=5) if s.template == "print_range"]
    return latest[0].id if latest and latest[0].state is dtask.RunState.PENDING else None


def test_a_broken_pipe_ends_quietly(dtask_env: dict[str, str]) -> None:
    shell = f"{DTASK} templates | true"  # the reader is gone before dtask writes
    result = subprocess.run(
        ["bash", "-c", shell], env=dtask_env, capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


def test_down_refuses_while_workers_of_the_stack_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    env.update(DTASK_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO))
    worker = WorkerProcess(env, tmp_path / "w.log", "-c", "1", "--hostname", "worker-1@%h")
    try:
        worker.wait_ready()
        refused = subprocess.run(
            [DTASK, "down"], env=env, capture_output=True, text=True, timeout=60
        )
        one_line(refused, 2, "workers of the stack in")
        assert "dtask down --force" in refused.stderr
    finally:
        worker.stop()
        subprocess.run([DTASK, "down", "--force"], env=env, capture_output=True, timeout=60)


def test_runs_shows_succeeded_failed_and_total_and_filters(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    bad = dtask.submit("always_fails", {"n": 30, "bad": 15})
    assert bad.wait(timeout=120).state is dtask.RunState.FAILED
    shown = cli(dtask_env, "runs", "--template", "always_fails", "--state", "failed")
    header, *rows = shown.stdout.splitlines()
    assert header.split()[:6] == ["ID", "TEMPLATE", "STATE", "OK", "FAILED", "TOTAL"]
    mine = next(r for r in rows if r.split()[0] == str(bad.id))
    assert mine.split()[1:6] == ["always_fails", "failed", "2", "1", "3"]
    none = cli(dtask_env, "runs", "--schedule", "no-such-schedule")
    assert none.returncode == 0 and len(none.stdout.splitlines()) == 1


VERSIONED = """
import dtask


@dtask.template("versioned", params={{"n": int}}, skeleton={{"n": "${{n}}"}},
                split=lambda r: [{{"n": r["n"]}}], reduce=lambda results: results[0])
def versioned(ctx, n):
    return {version}
"""


def test_up_reload_restarts_the_workers_when_a_template_file_changes(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "myjobs.py").write_text(VERSIONED.format(version=1))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    env.pop("PYTHONPATH", None)
    env.update(DTASK_HOME=str(tmp_path / "home"), DTASK_TEMPLATES="myjobs")
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [DTASK, "up", "--reload", "--workers", "1", "--no-flower", "--no-beat", "--no-api"],
        cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip

    def said(text: str) -> bool:
        return text in (tmp_path / "up.log").read_text()

    def result() -> str:
        done = subprocess.run(
            [DTASK, "submit", "versioned", "-e", "n=1", "--wait", "--json", "--timeout", "120"],
            cwd=folder, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return str(json.loads(done.stdout)["result"])

    try:
        wait_for(lambda: said("Ctrl-C stops everything."), 120, "dtask up to be up")
        assert said("reloading when a template module changes (myjobs)")
        assert result() == "1"
        (folder / "myjobs.py").write_text(VERSIONED.format(version=1) + "\ndef broken(:\n")
        wait_for(lambda: said("the same error (2 times in a row)"), 120, "a crash loop")
        assert said("dtask up: reload failed: worker-1 exited at start:")
        assert said("which has a syntax error: ") and said("worker-1 exited (exit code 2) after")
        assert said("restarting it in 1 s") and said("restarting it in 2 s")
        assert up.poll() is None  # the stack goes on, waiting for the fix
        (folder / "myjobs.py").write_text(VERSIONED.format(version=2))
        wait_for(lambda: said("dtask up: reloaded"), 120, "the reload")
        assert said("myjobs.py changed: reloading...")
        assert result() == "2"
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(60)
        log.close()
        subprocess.run([DTASK, "down", "--force"], env=env, capture_output=True, timeout=120)
