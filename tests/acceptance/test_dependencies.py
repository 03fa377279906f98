"""Runs that wait for other runs, end to end on real workers: a diamond runs in order with
its independent branches in parallel, a failure or a cancel fails everything below it without
a child ever running, reruns in order recover, and a worker killed while an upstream finalizes
does not lose (or double) the dependent's start."""

from __future__ import annotations

import itertools
import json
import os
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import dtask
from dtask import services
from dtask.db.database import sql
from tests.acceptance.test_core import cli
from tests.conftest import WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def times(run_id: int) -> tuple[datetime | None, datetime | None, int]:
    """(its first child's start, its finish, how many times it was split)."""
    with services.store().runs.db.tx() as conn:
        row = conn.execute(
            sql(
                "SELECT (SELECT min(started_at) FROM dtask_children WHERE run_id = r.id) AS first,"
                " finished_at, dispatches FROM dtask_runs r WHERE id = :id"
            ),
            {"id": run_id},
        ).one()
    return row.first, row.finished_at, row.dispatches


def slow(n: int = 40, after: list[Any] | None = None, delay: float = 0.05) -> dtask.Run:
    return dtask.submit("slow_range", {"n": n, "delay": delay}, after=after)


def test_a_diamond_runs_in_order_with_its_branches_in_parallel(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    hold = sink / "hold-diamond"
    hold.touch()  # A runs until D has been seen waiting, however slow the CLI starts
    a = dtask.submit("held_range", {"n": 20, "delay": 0.05, "hold": hold.name})
    b, c = slow(after=[a]), slow(after=[a.id])
    made = cli(dtask_env, "submit", "slow_range", "-e", "n=20", "-e", "delay=0.05",
               "--after", str(b.id), "--after-key", b.status().key,
               "--after", str(c.id))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"submitted, waiting for runs {b.id}, {c.id}" in made.stdout
    d = dtask.get_run(int(made.stdout.split()[1]))
    assert d.state is dtask.RunState.WAITING and d.status().waiting_for == (b.id, c.id)
    shown = json.loads(cli(dtask_env, "status", str(d.id), "--json").stdout)
    assert (shown["after"], shown["state"]) == ([b.id, c.id], "waiting")
    hold.unlink()
    assert d.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    (_, a_done, _), (b_first, b_done, _), (c_first, c_done, _), (d_first, _, split) = (
        times(r.id) for r in (a, b, c, d)
    )
    assert a_done and b_first and c_first and d_first and b_done and c_done
    assert a_done <= min(b_first, c_first)
    assert b_first < c_done and c_first < b_done  # B and C ran at the same time
    assert max(b_done, c_done) <= d_first and split == 1
    latency = (d_first - max(b_done, c_done)).total_seconds()
    print(f"\nlast upstream finalized -> first child: {latency * 1000:.0f} ms")
    graph = cli(dtask_env, "graph", str(d.id))
    assert graph.returncode == 0, graph.stderr
    assert f"├── run {b.id} slow_range (succeeded)" in graph.stdout
    assert f"run {a.id} held_range (succeeded) (see above)" in graph.stdout


def test_a_failed_upstream_fails_everything_below_it_and_no_child_runs(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    a = dtask.submit("always_fails", {"n": 10, "bad": 5})
    b = slow(after=[a])
    c_id = slow(after=[b]).id
    assert a.wait(timeout=120).state is dtask.RunState.FAILED
    b_status, c_status = b.status(), dtask.get_run(c_id).status()
    assert (b_status.state, b_status.error) == (
        dtask.RunState.FAILED,
        f"upstream run {a.id} failed",
    )
    assert (c_status.state, c_status.error) == (
        dtask.RunState.FAILED,
        f"upstream run {b.id} failed",
    )
    for run_id in (b.id, c_id):
        assert times(run_id) == (None, times(run_id)[1], 0)  # never split
        assert not list(sink.glob(f"{run_id}-*.txt"))
    refused = cli(dtask_env, "rerun", str(b.id))
    assert refused.returncode == 2
    assert (
        f"upstream run {a.id} failed; rerun that one first (dtask rerun {a.id})" in refused.stderr
    )


def test_a_cancelled_diamond_recovers_by_rerunning_it_in_order(
    dtask_env: dict[str, str], workers: list[WorkerProcess]
) -> None:
    a = slow(80, delay=0.1)  # 4 children of 2 s
    b, c = slow(after=[a]), slow(after=[a])
    d = slow(20, after=[b, c])
    wait_for(lambda: a.status().children.running > 0, 60, "A to start")
    a.cancel()
    for run, upstream, how in ((b, a, "was cancelled"), (c, a, "was cancelled"), (d, b, "failed")):
        assert run.status().error == f"upstream run {upstream.id} {how}"
    a.rerun()
    for run in (b, c, d):  # in order: each waits for the one rerun before it
        assert run.rerun().state is dtask.RunState.WAITING
    assert d.wait(timeout=180).state is dtask.RunState.SUCCEEDED
    assert all(r.status().state is dtask.RunState.SUCCEEDED for r in (a, b, c))
    assert times(d.id)[0] >= max(times(b.id)[1], times(c.id)[1])  # type: ignore[operator]


def test_a_worker_killed_while_an_upstream_finalizes_still_starts_the_dependent_once(
    dtask_env: dict[str, str], workers: list[WorkerProcess], sink: Path
) -> None:
    marker = sink / "hanging-reduce.pid"
    up = dtask.submit("hanging_reduce", {"n": 30})
    down = dtask.submit("hanging_reduce", {"n": 20}, after=[up])
    wait_for(marker.exists, 120, "the upstream's finalize to start its reduce")
    wait_for(lambda: marker.read_text().strip().isdigit(), 10, "the pid")
    os.kill(int(marker.read_text()), signal.SIGKILL)  # the pool process finalizing it
    assert down.wait(timeout=180).state is dtask.RunState.SUCCEEDED
    assert up.status().result == 3 and down.status().result == 2
    assert times(down.id)[2] == 1  # split once
    lines = [line for f in sink.glob(f"{down.id}-*.txt") for line in f.read_text().splitlines()]
    assert sorted(lines) == ["1..10", "11..20"]  # each child ran once


def test_naming_a_run_that_does_not_exist_creates_nothing(dtask_env: dict[str, str]) -> None:
    before = len(services.store().runs.statuses(limit=1000))
    for args in (["--after", "987654321"], ["--after-key", "no-such-key"]):
        refused = cli(dtask_env, "submit", "print_range", "-e", "n=5", "--key", "dep-x", *args)
        assert refused.returncode == 2, refused.stderr
        assert "after: no run with" in refused.stderr and "Traceback" not in refused.stderr
    assert len(services.store().runs.statuses(limit=1000)) == before
    with pytest.raises(dtask.UpstreamNotFound):
        dtask.submit("print_range", {"n": 5}, after=[987654321])


def test_a_fan_in_of_a_thousand_and_a_chain_of_two_hundred_complete_once_each(
    workers: list[WorkerProcess],
) -> None:
    """The figures of this shape are `python -m bench.deps`'s (docs/dependencies.md)."""
    ups = [dtask.submit("print_range", {"n": 1}) for _ in range(1000)]
    fan_in = dtask.submit("print_range", {"n": 1}, after=ups)
    chain = [dtask.submit("print_range", {"n": 1})]
    for _ in range(199):
        chain.append(dtask.submit("print_range", {"n": 1}, after=[chain[-1]]))
    assert fan_in.wait(timeout=600).state is dtask.RunState.SUCCEEDED
    assert chain[-1].wait(timeout=600).state is dtask.RunState.SUCCEEDED
    runs = [*ups, fan_in, *chain]
    with services.store().runs.db.tx() as conn:
        bad = conn.execute(
            sql(
                "SELECT id, state, dispatches FROM dtask_runs WHERE id = ANY(:ids)"
                " AND (state <> 'succeeded' OR dispatches <> 1)"
            ),
            {"ids": [r.id for r in runs]},
        ).all()
    assert bad == []
    first = {r.id: times(r.id)[0] for r in (fan_in, *chain)}
    assert first[fan_in.id] >= max(times(u.id)[1] for u in ups)  # type: ignore[type-var]
    for a, b in itertools.pairwise(chain):
        assert first[b.id] >= times(a.id)[1]  # type: ignore[operator]
