"""RabbitMQ as a replicated broker's users run it (docs/deployment.md), on a node of the test's
own (tests/support/rabbitmq.py): dtask's queues declared as quorum queues
(``DTASK_RABBITMQ_QUEUE_TYPE=quorum``) and the node's app stopped and started mid-run; and a
node that comes back with nothing (its data wiped). Each run finishes with every child
succeeded once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import dtask
from dtask import services
from soak.cluster import FAST
from tests.conftest import DTASK, REPO, running_workers, submitted
from tests.support.db import children, wait_for
from tests.support.pauses import pause_after
from tests.support.rabbitmq import Node, rabbitmq_node

pytestmark = pytest.mark.acceptance

N = 200


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with rabbitmq_node(tmp_path / "rabbitmq") as started:
        yield started


def environment(dtask_env: dict[str, str], node: Node, **extra: str) -> dict[str, str]:
    resolved = services.ensure_broker()  # the session's PostgreSQL and Redis, named
    return {
        **dtask_env,
        **FAST,
        "DTASK_DATABASE_URL": resolved.database_url,
        "DTASK_BROKER_URL": node.url,
        "DTASK_RESULT_BACKEND": resolved.result_backend,
        **extra,
    }


def succeeded(run_id: int) -> int:
    return sum(state == "succeeded" for _, state, _ in children(run_id))


def finished_once(run_id: int, sink: Path) -> None:
    status = dtask.get_run(run_id).wait(timeout=120)
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    rows = children(run_id)
    assert [s for _, s, _ in rows] == ["succeeded"] * N
    assert len(list(sink.glob(f"{run_id}-*.txt"))) == N
    assert sum(1 for _, _, attempt in rows if attempt > 1) == 0, "a child ran twice"


def test_the_node_s_app_stopped_and_started_mid_run_loses_nothing(
    dtask_env: dict[str, str], node: Node, sink: Path, tmp_path: Path
) -> None:
    queue_type = "quorum"  # classic queues restart the same way (docs/deployment.md)
    env = environment(dtask_env, node, DTASK_RABBITMQ_QUEUE_TYPE=queue_type)
    with running_workers(env, tmp_path, 2, "-c", "2"):
        assert node.queue_types().get("dtask") == queue_type
        run_id = submitted(env, "tagged", n=N, delay=0.05)
        wait_for(lambda: succeeded(run_id) >= N // 4, 60, "a quarter of the run")
        stopped = time.time()
        node.ctl("stop_app")
        node.ctl("start_app")
        finished_once(run_id, sink)
        pause, resumed = pause_after(sink, run_id, stopped)
        print(f"\n{queue_type} queues, stop_app/start_app: children started again {resumed:.1f} s"
              f" after stop_app (longest pause {pause:.1f} s)")  # fmt: skip


def test_a_node_back_without_its_data_is_refilled_from_postgresql(
    dtask_env: dict[str, str], node: Node, sink: Path, tmp_path: Path
) -> None:
    env = environment(dtask_env, node)
    with running_workers(env, tmp_path, 2, "-c", "2"):
        run_id = submitted(env, "tagged", n=N, delay=0.05)
        wait_for(lambda: succeeded(run_id) >= N // 4, 60, "a quarter of the run")
        wiped = time.time()
        node.wipe_and_restart()
        finished_once(run_id, sink)
        pause, resumed = pause_after(sink, run_id, wiped)
        print(f"\nnode back without its data: children started again {resumed:.1f} s after"
              f" the kill (longest pause {pause:.1f} s)")  # fmt: skip


def test_a_queue_of_another_type_is_one_line_and_exit_2(
    dtask_env: dict[str, str], node: Node
) -> None:
    from kombu import Connection

    with Connection(node.url) as conn:  # made classic by an earlier deployment
        conn.channel().queue_declare("dtask", durable=True, auto_delete=False)
    env = environment(dtask_env, node, DTASK_RABBITMQ_QUEUE_TYPE="quorum")
    done = subprocess.run(
        [DTASK, "worker", "-c", "1"], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("dtask: ")]
    assert "refuses queue 'dtask'" in line and "x-queue-type" in line
    assert "Traceback" not in done.stderr
