"""Chains that wait (tests/celery_project, real `celery -A proj worker` processes): in a Celery
chain the step after a template's signature runs once the run has finished, with the run's
result; a run that fails fails the chain with its error (the next step does not run, the
chain's errback gets the error, the chain's result raises it), as a failing task would."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from dtask import services
from dtask.domain.runs import RunState
from tests.acceptance.test_celery_app import (  # noqa: F401 (start: a fixture)
    CeleryWorker,
    in_project,
    project_env,
    start,
)
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance
# Redis databases of the embedded Redis (16) that no other test file uses for its broker


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finished_at(run_id: int) -> float:
    with services.store().engine.connect() as conn:
        return float(
            conn.execute(
                text("SELECT extract(epoch FROM finished_at) FROM dtask_runs WHERE id = :r"),
                {"r": run_id},
            ).scalar_one()
        )


def test_the_step_after_a_run_waits_for_it_and_gets_its_result(
    start: Callable[..., CeleryWorker],  # noqa: F811
    dtask_env: dict[str, str],
    tmp_path: Path,
) -> None:
    env = project_env(dtask_env, tmp_path, None, 8)
    worker = start(env, "-Q", "celery,dtask", "-c", "2")
    out = in_project(
        env,
        "import json; from celery import chain; from proj.tasks import proj_total, record\n"
        "res = chain(proj_total.s(n=200, delay=0.01), record.s()).apply_async()\n"
        "print(json.dumps({'value': res.get(timeout=120), 'run': res.parent.get(timeout=10)}))",
    )
    got = json.loads(out)
    run_id = got["run"]
    print(f"\nchain(proj_total.s(n=200), record.s()): record got {got['value']} (run {run_id})")
    status = services.store().runs.status(run_id)
    assert status.state is RunState.SUCCEEDED
    assert got["value"] == status.result == 200 * 201 // 2
    recorded = lines(tmp_path / "chain.jsonl")
    assert [r["got"] for r in recorded] == [status.result]
    assert recorded[0]["at"] >= finished_at(run_id), "the next step ran after the run ended"

    # a run that fails: the next step never runs; the errback gets the run's error
    out = in_project(
        env,
        "from celery import chain; from proj.tasks import proj_fails, record, on_chain_error\n"
        "res = chain(proj_fails.s(n=20), record.s()).apply_async("
        "link_error=on_chain_error.s())\n"
        "try:\n"
        "    print('returned', res.get(timeout=120))\n"
        "except Exception as exc:\n"
        "    print('raised', type(exc).__name__, exc)\n"
        "print(res.parent.get(timeout=10))",
    )
    said, failed_run = out.splitlines()[0], int(out.splitlines()[-1])
    print(f"chain(proj_fails.s(n=20), record.s()).get(): {said}")
    assert services.store().runs.status(failed_run).state is RunState.FAILED
    assert said.startswith("raised RunFailed"), said
    assert f"run {failed_run} failed: 2 child task(s) failed" in said
    errors = wait_for(lambda: lines(tmp_path / "errors.jsonl"), 30, "the chain's errback")
    print(f"errback got: {errors}")
    assert len(errors) == 1 and errors[0]["type"] == "RunFailed"
    assert f"run {failed_run} failed: 2 child task(s) failed" in errors[0]["error"]
    assert errors[0]["at"] >= finished_at(failed_run)
    # the first run's chain went on once, whoever finalized it (its last child, the chord's
    # callback); the failed run's next step never ran
    assert [r["got"] for r in lines(tmp_path / "chain.jsonl")] == [status.result]
    assert "its chains continue with its result" in worker.output()

    # a run cancelled while its chain waits: the reaper hands the chain to a pool process,
    # and the errback gets RunCancelled
    out = in_project(
        env,
        "from celery import chain; from proj.tasks import proj_total, record, on_chain_error\n"
        "res = chain(proj_total.s(n=400, delay=0.05), record.s()).apply_async("
        "link_error=on_chain_error.s())\n"
        "print(res.parent.get(timeout=30))",
    )
    cancelled = int(out)
    assert services.store().runs.cancel(cancelled) is RunState.CANCELLED
    errors = wait_for(
        lambda: (found := lines(tmp_path / "errors.jsonl"))[1:] and found, 60, "the errback"
    )
    print(f"errback of the cancelled run's chain got: {errors[1]}")
    assert errors[1]["type"] == "RunCancelled"
    assert errors[1]["error"] == f"run {cancelled} was cancelled"
    assert [r["got"] for r in lines(tmp_path / "chain.jsonl")] == [status.result]
