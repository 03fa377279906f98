"""A bulk submit's masters go several runs to a ``dtask.masters`` message (dtask/worker/
masters.py), run one after another in a pool process while their children are short, the
rest sent back for any process to take: every run still runs once, a long child holds no
other run, and a worker killed in the middle of such a message loses none."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

import dtask
from dtask import services
from dtask.worker.masters import PER_MESSAGE
from tests.conftest import WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


def received(workers: list[WorkerProcess]) -> Counter[str]:
    """Celery's "Task <name>[id] received" lines of dtask's tasks, by task name."""
    logs = "".join(w.output() for w in workers)
    return Counter(re.findall(r"Task (dtask\.\w+)\[[^\]]+\] received", logs))


def finished(ids: list[int]) -> dict[str, int]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, count(*) FROM dtask_runs WHERE id = ANY(:ids) GROUP BY state"),
            {"ids": ids},
        )
        return {str(state): int(n) for state, n in rows}


def ran(sink: Path, ids: list[int]) -> Counter[int]:
    """How many times each run's one child wrote its line."""
    paths = {i: sink / f"{i}.tiny" for i in ids}
    return Counter({i: len(p.read_text().splitlines()) for i, p in paths.items() if p.exists()})


def messages_to_run_once(
    workers: list[WorkerProcess], sink: Path, submit: Callable[[], list[int]], bound: float
) -> Counter[str]:
    """The dtask messages the workers received while the runs ``submit`` made (one ``tiny``
    child each) succeeded, each child having run once."""
    before = received(workers)
    ids = submit()
    wait_for(lambda: finished(ids).get("succeeded") == len(ids), bound, "the runs to succeed")
    assert ran(sink, ids) == Counter(dict.fromkeys(ids, 1))
    return received(workers) - before


def test_a_bulk_submit_s_short_runs_share_master_messages_and_each_runs_once(
    workers: list[WorkerProcess], sink: Path
) -> None:
    dtask.submit("tiny", {"n": 1, "fail_every": 0}).wait(timeout=60)  # the template is seen

    def submit() -> list[int]:
        found = dtask.submit_many("tiny", [{"n": 1, "fail_every": 0}] * 600)
        ids = [s.run_id for s in found if s.run_id is not None]
        assert len(ids) == 600
        return ids

    sent = messages_to_run_once(workers, sink, submit, 180)
    print(f"\n600 bulk runs: {sent['dtask.masters']} dtask.masters messages")
    assert sent["dtask.masters"] > 0, sent
    # sent back tails count too; one message per run would be 600
    assert sent["dtask.masters"] + sent["dtask.master"] < 600 / 2, sent


def test_a_long_child_holds_no_other_run_of_its_message(workers: list[WorkerProcess]) -> None:
    """Four runs of one 3-second child in one message: the message runs the first alone and
    sends the others back, so the four run at once on the four pool processes."""
    found = dtask.submit_many("slow_range", [{"n": 20, "delay": 0.15}] * 4)
    ids = [s.run_id for s in found if s.run_id is not None]
    wait_for(lambda: finished(ids).get("succeeded") == 4, 120, "4 runs to succeed")
    with services.store().engine.connect() as conn:
        spans = conn.execute(
            text(
                "SELECT min(started_at) AS first, max(started_at) AS last,"
                " min(finished_at) AS done FROM dtask_children WHERE run_id = ANY(:ids)"
            ),
            {"ids": ids},
        ).one()
    # each child started before the first one ended: none waited behind another
    assert spans.last < spans.done, spans


def test_a_worker_killed_in_the_middle_of_a_masters_message_loses_no_run(
    dtask_env: dict[str, str], sink: Path, tmp_path: Path
) -> None:
    started = [WorkerProcess(dtask_env, tmp_path / f"w{i}.log", "-c", "2") for i in range(2)]
    try:
        for w in started:
            w.wait_ready()
        dtask.submit("tiny", {"n": 1, "fail_every": 0}).wait(timeout=60)
        found = dtask.submit_many("tiny", [{"n": 1, "fail_every": 0}] * 2000)
        ids = [s.run_id for s in found if s.run_id is not None]
        wait_for(lambda: finished(ids).get("succeeded", 0) >= 300, 120, "300 runs done")
        assert received(started)["dtask.masters"] > 0
        os.killpg(started[0].proc.pid, signal.SIGKILL)
        started[0].proc.wait(30)
        wait_for(lambda: finished(ids).get("succeeded") == 2000, 240, "every run to succeed")
        counts = ran(sink, ids)
        assert set(counts) == set(ids)
        # a killed pool process's children whose successes were held (at most a message's
        # runs, within received.UNWRITTEN_FOR of their split) run again, each once
        assert max(counts.values()) <= 2, counts.most_common(3)
        assert sum(counts.values()) - len(ids) <= 2 * PER_MESSAGE, counts.most_common(3)
    finally:
        for w in started:
            w.stop()
