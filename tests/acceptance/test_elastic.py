"""Straggler stealing with real workers (docs/elastic.md): four workers of two slots each; a
run of four children whose third holds a range ten times slower. Its free slots take the
straggler's rest, piece by piece, and every number is done exactly once; the same run of a
template with ``stealable=False`` waits for its straggler. The same with a command template
over a shell script (tests/support/commands/straggle.sh) that reads its range's end back
after each checkpoint (tests/integration/test_batch_steal.py cuts one inside a message of
several). A worker SIGKILLed after a cut loses nothing: its child resumes from
its checkpoint with the range the cut left it."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import dtask
from dtask.templating import command_templates
from tests.conftest import REPO, WorkerProcess, running_workers
from tests.support.db import child_row, children, owner_pid, wait_for

pytestmark = pytest.mark.acceptance

N, DELAY = 400, 0.01  # children of 100 numbers: 1 s each, the straggler's 10 s
SLOW = {"slow_from": 201, "slow_to": 300}
EVERY = 5  # the templates' checkpoint_every
JOBS = REPO / "tests" / "support" / "commands" / "jobs.toml"


@pytest.fixture(scope="module")
def eight_slots(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    command_templates.load(JOBS)  # this process submits its templates: it knows them too
    env = {**dtask_env, "DTASK_TEMPLATES": f"{dtask_env['DTASK_TEMPLATES']},{JOBS}"}
    with running_workers(env, tmp_path_factory.mktemp("elastic"), 4, "-c", "2") as started:
        from dtask.client.workers import slots_for

        wait_for(lambda: slots_for("dtask") == 8, 30, "8 live slots")
        yield started


def printed(sink: Path, run_id: int) -> Counter[int]:
    return Counter(
        int(line) for f in sink.glob(f"{run_id}-*.txt") for line in f.read_text().split()
    )


def variables(template: str) -> dict[str, object]:
    """The command's delays are in its TOML file's env."""
    return {**SLOW, **({} if "_cmd" in template else {"delay": DELAY})}


def timed(template: str) -> tuple[int, float]:
    started = time.monotonic()
    run = dtask.submit(template, {"n": N, **variables(template)})
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    return run.id, time.monotonic() - started


@pytest.mark.parametrize("template", ["straggler", "straggler_cmd"])
def test_free_slots_take_a_stragglers_rest_and_every_number_runs_once(
    eight_slots: list[WorkerProcess], sink: Path, template: str
) -> None:
    fixed_id, fixed = timed(f"{template}_fixed")
    stolen_id, stolen = timed(template)
    print(f"\n{template}: {fixed:.1f} s not stealable, {stolen:.1f} s with stealing")
    assert len(children(fixed_id)) == 4
    pieces = children(stolen_id)
    assert len(pieces) > 4, "no straggler gave work away"
    assert all(state == "succeeded" for _, state, _ in pieces)
    for run_id in (fixed_id, stolen_id):
        seen = printed(sink, run_id)
        assert sorted(seen) == list(range(1, N + 1))
        assert set(seen.values()) == {1}, "a number ran twice"
    # ten times ~1 s of slow numbers spread over free slots; the bench measures it exactly
    assert stolen < 0.75 * fixed, (stolen, fixed)


@pytest.mark.parametrize("template", ["straggler", "straggler_cmd"])
def test_a_worker_killed_after_a_cut_loses_nothing(
    eight_slots: list[WorkerProcess], sink: Path, template: str
) -> None:
    run = dtask.submit(template, {"n": N, **variables(template)})
    wait_for(lambda: len(children(run.id)) > 4, 60, "a first cut")
    owner = wait_for(lambda: child_row(run.id, 2).owner, 30, "the straggler to run")
    victim = next(w for w in eight_slots if os.getpgid(owner_pid(owner)) == w.proc.pid)
    victim.kill()  # the whole worker, SIGKILL, right after its child's range was cut
    status = run.wait(timeout=120)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen = printed(sink, run.id)
    assert sorted(seen) == list(range(1, N + 1))
    again = sum(count - 1 for count in seen.values())
    killed = sum(1 for _, _, attempt in children(run.id) if attempt > 1)
    assert killed >= 1
    assert again <= EVERY * killed, (again, killed)  # a checkpoint's worth a killed child
