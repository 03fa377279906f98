"""Broker-side tools for the lost-message tests, run as a subprocess with a cluster's
environment (so it talks to that cluster's broker, Redis or RabbitMQ):

    python -m tests.support.broker lose N DELAY   a slow_range run whose child message is lost
    python -m tests.support.broker busy MIN       keep at least MIN messages waiting, for ever
    python -m tests.support.broker purge          empty the default queue
"""

from __future__ import annotations

import sys
import time
import uuid

from kombu import Queue
from sqlalchemy import text

import dtask
from dtask import services
from dtask.domain.runs import NewRun
from dtask.worker import configure
from dtask.worker.app import app
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.dispatcher import Dispatcher
from dtask.worker.messages import child_task_id
from dtask.worker.tasks import run_master


def delete_message(task_id: str) -> bool:
    """Take the task's message out of the queue and ack it; put the others back."""
    found = False
    others = []
    with app.connection_for_write() as conn:
        queue = Queue(DEFAULT_QUEUE, no_declare=True).bind(conn.default_channel)
        while (message := queue.get(no_ack=False)) is not None:
            if message.headers.get("id") == task_id:
                message.ack()
                found = True
            else:
                others.append(message)
        for message in others:
            message.reject(requeue=True)
    return found


def sent(run_id: int) -> bool:
    with services.store().engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT sent_at IS NOT NULL FROM dtask_children WHERE run_id = :r AND index = 0"
                ),
                {"r": run_id},
            ).scalar()
        )


def lose(n: int, delay: float) -> int:
    """A run split here (its master never queued), its one child's message deleted from the
    broker once sent (by the dispatcher: this process's passes or a worker's), before any
    worker took it."""
    store = services.store()
    variables = {"n": n, "delay": delay}
    run_id, _ = store.runs.create(NewRun("slow_range", f"lost:{uuid.uuid4()}", variables, 3, None))
    run_master(store, run_id)
    group = store.runs.get(run_id).group_id
    assert group is not None
    dispatcher = Dispatcher()
    deadline = time.monotonic() + 30
    while not sent(run_id) and time.monotonic() < deadline:
        dispatcher.once()
        time.sleep(0.01)
    if not delete_message(child_task_id(group, 0)):
        raise SystemExit(f"run {run_id}: its child's message was not in the queue")
    return run_id


def waiting() -> int:
    """Children waiting for a worker (in the broker's window or in PostgreSQL) and masters."""
    with services.store().engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM dtask_children c JOIN dtask_runs r"
                    "   ON r.id = c.run_id WHERE c.state = 'pending' AND r.state = 'running')"
                    " + (SELECT count(*) FROM dtask_runs WHERE state = 'pending')"
                )
            ).scalar_one()
        )


def busy(least: int) -> None:
    """Small runs (four half-second children each), submitted whenever fewer than ``least``
    children wait: a queue that never empties, even on a busy machine. Counted in PostgreSQL:
    the broker holds only the dispatcher's window of them."""
    while True:
        if waiting() < least:
            dtask.submit("slow_range", {"n": 80, "delay": 0.025})
        else:
            time.sleep(0.05)


def main(argv: list[str]) -> None:
    configure()
    command, *args = argv
    if command == "lose":
        print(lose(int(args[0]), float(args[1])), flush=True)
    elif command == "busy":
        busy(int(args[0]))
    elif command == "purge":
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(DEFAULT_QUEUE)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
