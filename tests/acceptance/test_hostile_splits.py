"""Splits and checkpoints that would take a worker down, on a real worker: a generator that
never ends, a split that hangs, a checkpoint of megabytes. Each fails its own run (or
attempt) quickly with one clear line, and the worker goes on to the next run."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import dtask
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def worker(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    env = {**dtask_env, "DTASK_SPLIT_TIMEOUT": "3", "DTASK_MAX_CHILDREN": "50000"}
    process = WorkerProcess(env, tmp_path_factory.mktemp("hostile") / "w.log", "-c", "2")
    try:
        process.wait_ready()
        yield
    finally:
        process.stop()


def test_an_endless_generator_split_fails_its_run_quickly(worker: None) -> None:
    started = time.monotonic()
    status = dtask.submit("endless_split", {"n": 1}).wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    assert "the split yields more than the maximum 50,000 children" in (status.error or "")
    print(f"\nendless split failed in {time.monotonic() - started:.1f} s")


def test_a_hanging_split_fails_its_run_after_the_split_timeout(worker: None) -> None:
    status = dtask.submit("hanging_split", {"n": 1}).wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    says = "the split of template 'hanging_split' did not finish within 3 s (DTASK_SPLIT_TIMEOUT)"
    assert says in (status.error or ""), status.error
    assert dtask.submit("print_range", {"n": 5}).wait(timeout=120).state is dtask.RunState.SUCCEEDED


def test_a_checkpoint_over_its_limit_fails_the_child_saying_so(worker: None) -> None:
    status = dtask.submit("big_checkpoint", {"kb": 4096}).wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    assert "checkpoint is 4,194,3" in (status.error or "")
    assert "over the limit of 1,048,576 (DTASK_MAX_CHECKPOINT)" in (status.error or "")
    assert dtask.submit("big_checkpoint", {"kb": 4}).wait(timeout=120).state is (
        dtask.RunState.SUCCEEDED
    )


def test_kwargsrepr_of_a_big_spec_is_cut_at_celerys_limit(dtask_env: dict[str, str]) -> None:
    from dtask.worker.messages import readable

    shown = readable("t", 1, 0, {"blob": "x" * 60_000})
    assert len(shown["kwargsrepr"]) <= 1100 and shown["argsrepr"] == "t run 1 child 0"


def test_kwargsrepr_of_a_message_of_many_children_shows_a_few_and_counts_the_rest(
    dtask_env: dict[str, str],
) -> None:
    from dtask.db import Redispatch
    from dtask.worker.messages import SPECS_SHOWN, readable_batch

    group = [Redispatch(7, i, {"a": i, "blob": "x" * 50}, "t", "g", None) for i in range(400)]
    shown = readable_batch(group)
    assert shown["argsrepr"] == "t run 7 children 0-399"
    assert shown["kwargsrepr"].endswith(f" and {400 - SPECS_SHOWN} more"), shown["kwargsrepr"]
    assert "'a': 0" in shown["kwargsrepr"] and "'a': 399" not in shown["kwargsrepr"]
