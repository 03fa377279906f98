"""A run has an answer: children return small JSON values, the template's reduce combines
them (in index order) into the run's result, shown by `dtask result`, `status --json` and
`Run.get()`; what cannot be kept fails with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dtask
from tests.acceptance.test_core import cli
from tests.conftest import WorkerProcess

pytestmark = pytest.mark.acceptance


def test_children_return_values_and_reduce_makes_the_runs_result(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    run = dtask.submit("sum_squares", {"n": 10_000})  # 10 children, each a partial sum
    assert run.get(timeout=120) == sum(i * i for i in range(1, 10_001))
    shown = cli(dtask_env, "result", str(run.id))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == 333_383_335_000
    status = json.loads(cli(dtask_env, "status", str(run.id), "--json").stdout)
    assert status["result"] == 333_383_335_000
    ordered = dtask.submit("returns", {"n": 45, "what": "sum"})  # 5 children: 10,10,10,10,5
    assert ordered.get(timeout=120) == {"children": 5, "total": sum(range(1, 46))}
    listed = json.loads(cli(dtask_env, "children", str(ordered.id), "--json").stdout)
    assert [c["result"] for c in listed][-1] == {"a": 41, "b": 45, "sum": sum(range(41, 46))}
    one = cli(dtask_env, "status", str(ordered.id), "--child", "4")
    assert f'  result     {{"a": 41, "b": 45, "sum": {sum(range(41, 46))}}}' in one.stdout


def test_a_reduce_that_raises_fails_the_run_with_its_error(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    run = dtask.submit("bad_reduce", {"n": 30})
    with pytest.raises(dtask.RunFailed, match="cannot combine 3 results") as caught:
        run.get(timeout=120)
    assert "reduce of template 'bad_reduce' raised ValueError" in str(caught.value)
    shown = cli(dtask_env, "result", str(run.id))
    assert shown.returncode == 1 and "raised ValueError: cannot combine 3 results" in shown.stderr
    assert cli(dtask_env, "status", str(run.id)).returncode == 1  # a failed run, no --watch


@pytest.mark.parametrize(
    ("what", "says"),
    [
        (
            "big",
            "returned 100,002 bytes of JSON, over the limit of 65,536 (DTASK_MAX_CHILD_RESULT)",
        ),
        ("set", "returned set, not JSON"),
    ],
)
def test_a_result_that_cannot_be_kept_fails_the_child_saying_why(
    workers: list[WorkerProcess], what: str, says: str
) -> None:
    run = dtask.submit("returns", {"n": 10, "what": what})
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    assert says in (status.error or ""), status.error


def test_result_of_an_unfinished_run_says_so(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    run = dtask.submit("sum_squares", {"n": 5}, countdown=60)  # held back: still pending
    shown = cli(dtask_env, "result", str(run.id))
    assert shown.returncode == 3
    assert f"run {run.id} is pending: no result yet (dtask result {run.id} --wait)" in shown.stderr
    run.revoke()


@pytest.mark.parametrize(
    ("how", "attempts", "says"),
    [
        (
            "permanent",
            1,
            "not retried (a permanent error) at attempt 1: the input file is malformed",
        ),
        ("key", 1, "not retried (a permanent error) at attempt 1: KeyError: 'no customer 42'"),
        ("set", 1, "not retried (a permanent error) at attempt 1: run "),
        ("value", 3, "gave up after 3 attempt(s): ValueError: the service said 503"),
    ],
)
def test_a_permanent_error_fails_the_child_at_once_and_others_are_retried(
    dtask_env: dict[str, str], workers: list[WorkerProcess], how: str, attempts: int, says: str
) -> None:
    run = dtask.submit("fails_how", {"how": how})
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.FAILED
    assert says in (status.error or ""), status.error
    sink = Path(dtask_env["DTASK_TEST_SINK"]) / f"{run.id}-0.txt"
    assert sink.read_text().splitlines() == [f"attempt {n}" for n in range(1, attempts + 1)]
