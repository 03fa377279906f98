"""Seeing a run's children: `dtask children RUN`, and one child's traceback with
`dtask status RUN --child N`."""

from __future__ import annotations

import json
import re

import pytest

import dtask
from tests.acceptance.test_core import cli
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance


def test_children_list_and_a_failed_childs_traceback(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    run = dtask.submit("always_fails", {"n": 30, "bad": 15})  # child 1 (11..20) always fails
    assert run.wait(timeout=120).state is dtask.RunState.FAILED
    listed = cli(dtask_env, "children", str(run.id))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3
    assert "failed" in lines[1] and "attempt 3/3" in lines[1] and "item 15 is poison" in lines[1]
    assert "succeeded" in lines[0] and "succeeded" in lines[2]
    failed = cli(dtask_env, "children", str(run.id), "--state", "failed", "--json")
    rows = json.loads(failed.stdout)  # one JSON document, as every --json prints
    assert [(r["index"], r["state"], r["spec"]) for r in rows] == [
        (1, "failed", {"a": 11, "b": 20, "bad": 15})
    ]
    shown = cli(dtask_env, "status", str(run.id), "--child", "1")
    assert shown.returncode == 0, shown.stderr
    assert "the last lines its latest failed attempt printed:" in shown.stdout
    assert "checking 11..20 (attempt 3)" in shown.stdout
    assert "traceback of its latest failed attempt:" in shown.stdout
    assert "Traceback (most recent call last):" in shown.stdout
    assert "ValueError: item 15 is poison" in shown.stdout
    assert "always_fails" in shown.stdout  # the frame of the template's function
    missing = cli(dtask_env, "status", str(run.id), "--child", "7")
    assert missing.returncode == 2 and f"run {run.id} has no child 7" in missing.stderr
    limited = cli(dtask_env, "children", str(run.id), "--limit", "0")
    assert limited.returncode == 2
    assert "argument --limit: '0' is not a positive whole number" in limited.stderr


def test_a_childs_log_lines_name_its_template_run_and_child(
    workers: list[WorkerProcess],
) -> None:
    run = dtask.submit("logs", {"n": 2})
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    logged = "".join(w.output() for w in workers)
    for index in (0, 1):
        line = f"logs run {run.id} child {index}: working on {index + 1}..{index + 1}"
        assert re.search(rf"INFO/ForkPoolWorker-\d+\] {re.escape(line)}$", logged, re.M), line


def test_scripting_submit_q_after_it_and_runs_q(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    first = cli(dtask_env, "submit", "print_range", "--var", "n=5", "-q")
    assert first.returncode == 0 and re.fullmatch(r"\d+\n", first.stdout), first
    then = cli(dtask_env, "submit", "print_range", "--var", "n=5", "-q", "--wait",
               "--after", first.stdout.strip())  # fmt: skip
    assert then.returncode == 0 and re.fullmatch(r"\d+\n", then.stdout), then
    latest = cli(dtask_env, "runs", "-q", "--limit", "2", "--template", "print_range")
    assert latest.stdout.split() == [then.stdout.strip(), first.stdout.strip()]
    none = cli(dtask_env, "children", then.stdout.strip(), "--state", "failed", "--json")
    assert json.loads(none.stdout) == []
    helped = cli(dtask_env, "children", "--help").stdout
    assert "--limit LIMIT" in helped and "(default 100)" in helped
    assert "--client CLIENT" in cli(dtask_env, "submit", "--help").stdout
    assert "(default: default)" in cli(dtask_env, "submit", "--help").stdout
    assert "default: 5555" in cli(dtask_env, "up", "--help").stdout
