"""Test mode (DTASK_EAGER=1, or Celery's task_always_eager): a submit runs its run in the
submitting process before it returns, through the worker's own split, child lifecycle and
finalize, against the real PostgreSQL, and sends nothing to the broker: here the broker and
result backend are a port nothing listens on, so any send would fail the submit."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import dtask
from dtask import services
from dtask.worker.app import current


@dtask.template(
    "eager_sum",
    params={"n": int},
    skeleton={"start": 1, "end": "${n}"},
    split=dtask.RangeSplit("start", "end", chunk=10),
    checkpoint_every=1,
    checkpoint_interval=3600,
    reduce=sum,
)
def eager_sum(ctx: dtask.ChildContext, a: int, b: int) -> int:
    total = 0
    for i in ctx.resume(range(a, b + 1)):
        total += i
    return total


@pytest.fixture
def eager(no_broker: None, settings_from: Callable[[dict[str, str]], None]) -> None:
    settings_from({"DTASK_EAGER": "1"})


def test_an_eager_delay_returns_its_run_finished_with_the_reduce_s_result(eager: None) -> None:
    began = time.monotonic()
    run = eager_sum.delay(n=25)
    took = time.monotonic() - began
    status = run.status()
    assert status.state is dtask.RunState.SUCCEEDED, status
    assert (status.children.total, status.children.succeeded) == (3, 3)
    assert status.result == 325
    assert run.get(timeout=0) == 325
    assert took < 10, took
    # checkpoints were written as a worker writes them (checkpoint_every=1)
    child = services.store().children.view(run.id, 2)
    assert child is not None
    assert (child.state, child.attempt, child.checkpoint) == (
        dtask.ChildState.SUCCEEDED,
        1,
        {"done": 5},
    )


def test_an_eager_child_that_keeps_failing_fails_its_run_after_its_attempts(
    eager: None, sink: Path
) -> None:
    run = dtask.submit("always_fails", {"n": 30, "bad": 15}, key=f"eager-{uuid.uuid4()}")
    status = run.status()
    assert status.state is dtask.RunState.FAILED, status
    assert "item 15 is poison" in (status.error or "")
    assert (status.children.succeeded, status.children.failed) == (2, 1)
    attempts = (sink / f"{run.id}-1.txt").read_text().split()
    assert attempts.count("attempt") == 3  # max_attempts=3, each one spent
    with pytest.raises(dtask.RunFailed, match="item 15 is poison"):
        run.get(timeout=0)
    # a rerun runs here too: the failed child's attempts again, from its checkpoint
    assert run.rerun().state is dtask.RunState.FAILED
    attempts = (sink / f"{run.id}-1.txt").read_text().split()
    assert attempts.count("attempt") == 6


def test_an_eager_child_resumes_from_its_checkpoint_after_a_failed_attempt(
    eager: None, sink: Path
) -> None:
    run = dtask.submit("flaky_range", {"n": 150, "fail_at": 125}, key=f"eager-{uuid.uuid4()}")
    assert run.state is dtask.RunState.SUCCEEDED
    done = [int(x) for x in (sink / f"{run.id}-1.txt").read_text().split()]
    assert sorted(set(done)) == list(range(101, 151))
    # checkpoint_every=10: the second attempt resumed after 120, its last checkpoint
    assert [i for i in set(done) if done.count(i) > 1] == list(range(121, 125))
    child = services.store().children.view(run.id, 1)
    assert child is not None and child.attempt == 2


def test_celery_s_task_always_eager_runs_it_here_too(no_broker: None) -> None:
    app = current()
    app.conf.task_always_eager = True
    try:
        run = eager_sum.apply_async(kwargs={"n": 12}, countdown=3600)
        assert run.get(timeout=0) == 78  # countdown ignored, as Celery's eager apply_async
    finally:
        app.conf.task_always_eager = False


def test_an_eager_submit_checks_as_any_submit_and_a_known_key_runs_once(eager: None) -> None:
    with pytest.raises(dtask.InvalidVariables):
        eager_sum.delay(n="many")
    key = f"eager-{uuid.uuid4()}"
    first = eager_sum.apply_async(kwargs={"n": 5}, key=key)
    again = eager_sum.apply_async(kwargs={"n": 5}, key=key)
    assert first.created and (again.id, again.created) == (first.id, False)
    assert again.get(timeout=0) == 15


def test_without_test_mode_a_submit_still_needs_its_broker(no_broker: None) -> None:
    """In a process of its own: an earlier test's in-process worker leaves this process's app
    a pool of connections to the session's broker, which a changed URL does not close."""
    import os
    import subprocess
    import sys

    code = (
        "import dtask\n"
        "from tests.integration.test_eager import eager_sum\n"
        "try:\n"
        "    eager_sum.delay(n=5)\n"
        "except dtask.BrokerUnavailable as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: cannot reach the broker"), done.stdout + done.stderr
