"""Masters sent in bulk (``dtask.submit_many``): one ``dtask.master`` message per run, or,
where ``per_message`` allows, one ``dtask.masters`` message for several runs of one template
and priority (the worker runs them one after another while their children are short:
``dtask.worker.tasks.masters``). What a busy service saves with it is docs/benchmarks.md's
"many small runs"."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from dtask.settings import is_redis
from dtask.worker.app import configure
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.messages import (
    PUBLISH_BATCH,
    TEMPLATE_HEADER,
    broker_priority,
    broker_unreachable,
    pipelined,
)
from dtask.worker.task_table import MASTER, MASTERS, PICKUP

PER_MESSAGE = 50  # runs of a bulk submit in one dtask.masters message, at most


@dataclass(frozen=True)
class Master:
    """A master message to send: its run, its template, the run's priority, the seconds
    before it may start, and what Flower shows of it."""

    run_id: int
    template: str
    priority: int
    countdown: float = 0.0
    shown: str = ""


def shown_runs(template: str, run_ids: list[int]) -> str:
    """What Flower and the logs show of a ``dtask.masters`` message."""
    first, last = run_ids[0], run_ids[-1]
    return f"{template} runs {first}..{last} ({len(run_ids)})"


def send_masters(masters: Iterable[Master], per_message: int = 1) -> int:
    """The masters through one producer, pipelined where the broker allows (Redis): those due
    now ``per_message`` runs of one template and priority to a ``dtask.masters`` message (a
    run alone goes as ``send_master`` sends it), each without its per-call routing, signals
    and task-sent event (as ``publish`` sends children). The messages sent; BrokerUnavailable
    when the broker cannot take them: the runs stay pending and the reaper sends their
    masters once they are overdue."""
    app = configure()
    queue = app.amqp.queues[DEFAULT_QUEUE]
    redis = is_redis(str(app.conf.broker_url))
    # Celery's message for each task, made once: a message differs in its id, its arguments
    # and what Flower shows (a countdown's eta is made for its message)
    made = {
        name: app.amqp.create_task_message("", name, (), None, ignore_result=True)
        for name in (MASTER, MASTERS)
    }
    sent = 0
    try:
        with app.producer_or_acquire(None) as producer, pipelined(producer, PUBLISH_BATCH):
            producer.maybe_declare(queue)
            for name, args, shown, priority, countdown, template in _messages(masters, per_message):
                task_id = str(uuid.uuid4())
                if countdown:
                    headers, properties, body, _ = app.amqp.create_task_message(
                        task_id, name, args, None, countdown=countdown, argsrepr=shown,
                        ignore_result=True,
                    )  # fmt: skip
                else:
                    headers = {**made[name].headers, "id": task_id, "root_id": task_id,
                               "argsrepr": shown}  # fmt: skip
                    properties = {**made[name].properties, "correlation_id": task_id}
                    body = (args, {}, made[name].body[2])
                if name == MASTER:  # a worker that knows it may take the run with others
                    headers = {**headers, TEMPLATE_HEADER: template}
                level = broker_priority(priority, 1)
                producer.publish(
                    body, exchange="", routing_key=queue.name, serializer="json",
                    delivery_mode=queue.exchange.delivery_mode, headers=headers, retry=False,
                    **({"priority": level} if redis else {}), **properties,
                )  # fmt: skip
                sent += 1
    except Exception as exc:
        raise broker_unreachable(app, exc) from None
    return sent


def _messages(
    masters: Iterable[Master], per_message: int
) -> Iterator[tuple[str, tuple[Any, ...], str, int, float, str]]:
    """(task, args, shown, priority, countdown, template) of each message, in the masters'
    order."""

    def together(m: Master) -> tuple[str, int, bool]:
        return m.template, m.priority, bool(m.countdown) or per_message <= 1

    for (template, priority, alone), runs in groupby(masters, key=together):
        found = list(runs)
        for at in range(0, len(found), 1 if alone else per_message):
            group = found[at : at + (1 if alone else per_message)]
            if len(group) == 1:
                m = group[0]
                yield MASTER, (m.run_id,), m.shown, m.priority, m.countdown, template
            else:
                ids = [m.run_id for m in group]
                shown = shown_runs(template, ids)
                yield MASTERS, (template, priority, ids), shown, priority, 0.0, template


ASKED_FOR = 5.0  # seconds a pickup's ask lives without its task: a lost message's bound
MOST_PICKED = 500  # runs one pickup reads at most; a full read asks for another


def _ask_key() -> str:
    return f"{DEFAULT_QUEUE}.pickup"


def ask_pickup(priority: int) -> None:
    """After a submit's commit: a ``dtask.pickup`` of its run (dtask/worker/pickup.py) at its
    ``priority``, unless one is asked for already. BrokerUnavailable where Redis cannot be
    reached."""
    app = configure()
    try:
        with app.producer_or_acquire(None) as producer:
            asked = producer.channel.client.set(_ask_key(), 1, nx=True, px=int(ASKED_FOR * 1000))
            if asked:
                app.send_task(
                    PICKUP,
                    queue=DEFAULT_QUEUE,
                    producer=producer,
                    ignore_result=True,
                    priority=broker_priority(priority, 1),
                )
    except Exception as exc:
        raise broker_unreachable(app, exc) from None


def forget_ask() -> None:
    """A pickup's task forgets the ask before it reads the runs waiting."""
    with configure().producer_or_acquire(None) as producer:
        producer.channel.client.delete(_ask_key())
