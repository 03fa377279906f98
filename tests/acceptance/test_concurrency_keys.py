"""Concurrency keys on real workers: runs of one customer beyond ``max_concurrent`` wait (never
fail), say why, and start in submit order as earlier ones finish, while other customers' runs
go ahead; the limit holds exactly across worker processes, through bulk submits, reruns and
the HTTP API; bad keys and limits get one line and create nothing."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import datetime
from pathlib import Path

import pytest

import dtask
from dtask import services
from dtask.db.database import sql
from tests.acceptance.test_core import cli
from tests.conftest import WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def held(sink: Path) -> Path:
    hold = sink / f"hold-{uuid.uuid4().hex}"
    hold.touch()
    return hold


def spans(run_ids: list[int]) -> dict[int, tuple[datetime, datetime]]:
    """Each run's first child's start and last child's finish."""
    with services.store().runs.db.tx() as conn:
        rows = conn.execute(
            sql(
                "SELECT run_id, min(started_at) AS first, max(finished_at) AS last"
                " FROM dtask_children WHERE run_id = ANY(:ids) GROUP BY run_id"
            ),
            {"ids": run_ids},
        ).all()
    return {int(r.run_id): (r.first, r.last) for r in rows}


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    now = top = 0
    for _, step in events:  # a finish sorts before a start at the same instant
        now += step
        top = max(top, now)
    return top


def test_runs_of_one_key_wait_say_why_and_start_in_order_while_other_keys_run(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    holds = [held(sink) for _ in range(3)]
    acme = [
        dtask.submit("per_customer", {"customer": "acme", "n": 10, "hold": h.name}) for h in holds
    ]
    other = dtask.submit("per_customer", {"customer": "globex", "n": 10, "hold": ""})
    assert other.wait(timeout=120).state is dtask.RunState.SUCCEEDED  # not held by acme's
    assert [r.state for r in acme[1:]] == [dtask.RunState.WAITING] * 2
    shown = cli(dtask_env, "status", str(acme[2].id), "--json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["waiting_reason"] == "concurrency_key"
    assert (
        f"concurrency key 'export:acme' of client default is at max_concurrent 1:"
        f" 1 unfinished (run {acme[0].id}); 1 of its runs wait ahead of this one"
    ) in status["waiting_because"]
    for run, hold in zip(acme, holds, strict=True):
        wait_for(lambda r=run: r.state is dtask.RunState.RUNNING, 60, f"run {run.id} to start")
        assert [r.state for r in acme if r is not run and not r.ready()] == [
            dtask.RunState.WAITING
        ] * sum(1 for r in acme if r is not run and not r.ready())
        hold.unlink()
        assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    times = spans([r.id for r in acme])
    ordered = [times[r.id] for r in acme]
    assert all(done <= start for (_, done), (start, _) in itertools.pairwise(ordered))


def test_the_limit_holds_exactly_across_workers_for_single_and_bulk_submits(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    key = f"batch:{uuid.uuid4().hex[:8]}"
    hold = held(sink)  # the first two hold their slots until both have been seen running
    options = {"concurrency_key": key, "max_concurrent": 2}
    variables = {"customer": "x", "n": 20, "hold": hold.name}
    runs = [dtask.submit("per_customer", variables, **options) for _ in range(6)]  # type: ignore[arg-type]
    runs += [
        dtask.get_run(s.run_id)  # type: ignore[arg-type]
        for s in dtask.submit_many("per_customer", [variables] * 6, **options)  # type: ignore[arg-type]
    ]

    def running() -> list[dtask.Run]:
        return [r for r in runs if r.state is dtask.RunState.RUNNING]

    wait_for(lambda: len(running()) == 2, 60, "two runs of the key to run")
    assert [r.state for r in runs if r not in running()] == [dtask.RunState.WAITING] * 10
    hold.unlink()
    for run in runs:
        assert run.wait(timeout=180).state is dtask.RunState.SUCCEEDED
    times = spans([r.id for r in runs])
    assert len(times) == 12
    assert most_at_once(list(times.values())) == 2


def test_a_rerun_waits_for_its_key_and_bad_keys_are_refused_whole(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    hold = held(sink)
    first = dtask.submit("per_customer", {"customer": "initech", "n": 10, "hold": hold.name})
    wait_for(lambda: first.state is dtask.RunState.RUNNING, 60, "the first run to start")
    second = dtask.submit("per_customer", {"customer": "initech", "n": 10, "hold": hold.name})
    second.cancel()
    assert second.rerun().state is dtask.RunState.WAITING  # its key is still taken
    hold.unlink()
    assert first.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    assert second.wait(timeout=120).state is dtask.RunState.SUCCEEDED

    before = dtask_runs_count()
    for args, message in (
        (("--max-concurrent", "0"), "max_concurrent must be"),
        (("--max-concurrent", "two"), "--max-concurrent expects a whole number, got 'two'"),
        (("--concurrency-key", "${nope}"), "names nope, not a parameter"),
        (("--concurrency-key", "x" * 201), "a key is 1 to 200 characters"),
    ):
        done = cli(
            dtask_env, "submit", "per_customer", "-e", "customer=a", "-e", "n=1", "-e", "hold=",
            *args,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    with pytest.raises(dtask.InvalidConcurrency, match="name a key"):
        dtask.submit("slow_range", {"n": 1, "delay": 0}, max_concurrent=2)
    assert dtask_runs_count() == before


def dtask_runs_count() -> int:
    with services.store().runs.db.tx() as conn:
        return int(conn.execute(sql("SELECT count(*) FROM dtask_runs")).scalar_one())
