"""Sending dtask's messages: a run's master, and its children as the header of a chord.

Messages are addressed by task name, so this module needs the Celery app but not the tasks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any, ClassVar

import celery
from celery.backends.redis import RedisBackend
from celery.utils.saferepr import saferepr
from kombu.utils import json

from dtask.db import Redispatch, RunRecord
from dtask.domain.dispatch import MESSAGE_BYTES, SMALL_RUN_CHILDREN
from dtask.exceptions import BrokerUnavailable
from dtask.settings import is_redis, mask
from dtask.worker.app import configure, current
from dtask.worker.config import DEFAULT_QUEUE
from dtask.worker.task_table import CHILD, CHILDREN, FINALIZE, MASTER, SUBMIT


class Sender:
    """A loop's own broker connection (the dispatcher's, a reaper pass's), opened when it first
    sends, not the app's pooled one. A child forked while a kombu connection is open shuts its
    socket down in its after-fork cleanup, for the parent too (the reaper's next send on
    RabbitMQ failed with "connection reset by peer"): after any fork the parent opens a new
    one, and a forked child never touches the parent's."""

    forks: ClassVar[int] = 0  # forks of this process so far (os.register_at_fork below)

    def __init__(self) -> None:
        self._connection: Any = None
        self._producer: Any = None
        self._opened_at = (os.getpid(), Sender.forks)

    @property
    def producer(self) -> Any:
        if self._producer is not None and self._opened_at != (os.getpid(), Sender.forks):
            self.close()
        if self._producer is None:
            self._connection = current().connection_for_write()
            self._producer = current().amqp.Producer(self._connection)
            self._opened_at = (os.getpid(), Sender.forks)
        return self._producer

    def close(self) -> None:
        if self._connection is not None and self._opened_at[0] == os.getpid():
            self._connection.release()  # a forked child leaves its parent's socket alone
        self._connection = self._producer = None

    @classmethod
    def forked(cls) -> None:
        cls.forks += 1


os.register_at_fork(after_in_parent=Sender.forked)


def submit_signature(
    template: str, variables: dict[str, Any], key: str | None, immutable: bool
) -> Any:
    """A Celery signature of ``dtask.submit`` for ``template`` (``Template.s``/``si``)."""
    return current().signature(
        SUBMIT,
        kwargs={"template": template, "variables": dict(variables), "key": key},
        immutable=immutable,
        queue=DEFAULT_QUEUE,
    )


TEMPLATE_HEADER = "dtask_template"
"""A master message's header naming its run's template, where the sender knew it."""


def send_master(
    run_id: int,
    through: Any = None,
    countdown: float = 0.0,
    shown: str | None = None,
    priority: int | None = None,
    template: str | None = None,
) -> None:
    """Wake a master for the run (a duplicate is harmless: the run's lock and state decide),
    after ``countdown`` seconds. Through ``through`` if given, else a producer from the
    app's pool. ``shown`` is what Flower and the logs show as its arguments (its template
    and trigger), where the caller knows them. With the run's ``priority`` its message goes
    at that priority's level on Redis (a run of one child often runs in its master), else at
    ``MASTERS``. With the run's ``template``, a master that knows it may take the run with
    others (``inline_runs.run_many``)."""
    app = configure()
    send = partial(
        app.send_task,
        MASTER,
        args=(run_id,),
        # a header, not an argument: a worker of an older dtask ignores it (a rolling deploy)
        headers={TEMPLATE_HEADER: template} if template is not None else None,
        queue=DEFAULT_QUEUE,
        countdown=countdown or None,
        argsrepr=shown or f"run {run_id}",
        retry=True,
        ignore_result=True,
        **_priority(MASTERS if priority is None else broker_priority(priority, 1)),
    )
    try:
        try:  # the message and its task-sent event in one round trip (Redis, kombu 5.7)
            with app.producer_or_acquire(through) as producer, pipelined(producer, 8):
                send(producer=producer)
        except Exception:  # failed at the flush, past the publish's retries: send it as
            send(producer=through)  # Celery does (a duplicate master is harmless)
    except Exception as exc:
        raise broker_unreachable(app, exc) from None


def broker_unreachable(app: celery.Celery, exc: Exception) -> BrokerUnavailable:
    """The one-line error of a message the broker did not take."""
    return BrokerUnavailable(
        f"cannot reach the broker at {mask(str(app.conf.broker_url))}: {exc}"
        " (is it running? set DTASK_BROKER_URL)"
    )


def send_finalize(run_id: int, through: Any = None) -> None:
    """Ask a worker's pool to finalize the run (the reaper does, for a run whose finalize runs
    user code: the template's reduce)."""
    current().send_task(
        FINALIZE,
        args=(run_id,),
        queue=DEFAULT_QUEUE,
        argsrepr=f"run {run_id}",
        ignore_result=True,
        producer=through,
    )


def send_chord(run: RunRecord, children: list[tuple[int, dict[str, Any]]]) -> None:
    """Publish the children as the header of a Celery chord whose callback is ``finalize``
    (where the result backend counts chords natively: Redis; with any other backend the
    children go out without one, and the run's last child finalizes it).

    Deterministic task ids (``<group>.<index>``) and the chord options let anyone re-send a
    child later with the same identity, so the chord still completes exactly once.
    """
    assert run.group_id is not None and run.chord_size is not None
    if chords():
        current().backend.set_chord_size(run.group_id, run.chord_size)
    publish(
        (
            Redispatch(run.id, index, spec, run.template, run.group_id, run.queue)
            for index, spec in children
        ),
        priority=SMALL_RUN if run.chord_size <= SMALL_RUN_CHILDREN else LARGE_RUN,
    )


# Redis pops priority 0 first (and unprioritised messages count as 0). Callbacks and re-sent
# children (failover, hand-over) go first; then masters and the children of small runs, so a
# short job never waits behind a large one's backlog; then large runs' children, FIFO.
# RabbitMQ needs x-max-priority queues (and counts the other way): there everything is FIFO.
RESEND, SMALL_RUN, LARGE_RUN = 0, 3, 6
# Masters beside small runs' children, not ahead of every child: in a burst of 10,000
# one-child runs, masters at 0 ran all before any child (and their backlog looked stuck).
# A submit sends its run's master at its priority's level instead (``broker_priority``).
MASTERS = SMALL_RUN


def broker_priority(priority: int, children: int) -> int:
    """Redis priority (0 first; kombu keeps the levels 0, 3, 6, 9) of a dispatched child, and
    of a submitted run's master (as a run of one child's):
    re-sent children stay at 0; within the window a high-priority run's children overtake
    the others already sent, and a small run's children (``children`` in all) go one level
    ahead of its priority's, so a short job never waits behind a large one's queued messages
    (at its priority's level a one-child run waited behind two 54-child messages: 306 ms p50).
    RabbitMQ's queue stays FIFO: there the small window alone bounds the wait."""
    level = 3 if priority >= 7 else 6 if priority >= 3 else 9
    return level - 3 if children <= SMALL_RUN_CHILDREN else level


def _priority(value: int) -> dict[str, int]:
    return {"priority": value} if is_redis(str(current().conf.broker_url)) else {}


def forget_chord(group_id: str) -> None:
    """Delete what the result backend keeps of a finished run's chord (its join list and
    counters, the callback's result; the children store none) and mark it done, so a
    straggler's part (a child that was finishing at a cancel) returns without writing."""
    if not chords():
        return
    backend = current().backend
    keys = [backend.get_key_for_group(group_id, part) for part in (".j", ".t", ".s", ".d")]
    keys.append(backend.get_key_for_task(f"{group_id}.finalize"))
    with backend.client.pipeline() as pipe:
        pipe.delete(*keys)
        pipe.set(backend.get_key_for_group(group_id, ".c"), "done", ex=STRAGGLERS)
        pipe.execute()


STRAGGLERS = 3600  # seconds a finished chord's done marker stays (Celery's own keeps 300)

# Celery 5.7's Redis backend checks the done marker before it counts a chord part (in one
# script): a part that returns after forget_chord writes nothing. Before 5.7 the part adds
# itself to a new join list, which would stay for result_expires (7 days): there a child's
# task sweeps it once its part is counted (``sweep_late_part``).
LATE_PARTS_IGNORED = tuple(celery.VERSION[:2]) >= (5, 7)

# Counted after forget_chord's atomic delete-and-mark, a part finds the mark here; counted
# before it, forget_chord deleted it. Either way nothing of a finished chord stays.
_SWEEP = """
if redis.call('GET', KEYS[1]) == 'done' then
    return redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
end
return 0
"""


def sweep_late_part(group_id: str) -> None:
    """After a child's chord part was counted (Celery before 5.7): if the run's chord was
    forgotten already (``forget_chord``'s done marker), delete what the part made again."""
    if LATE_PARTS_IGNORED or not chords():
        return
    backend = current().backend
    keys = [backend.get_key_for_group(group_id, part) for part in (".c", ".j", ".t", ".s", ".d")]
    backend.client.eval(_SWEEP, len(keys), *keys)


def chords() -> bool:
    """Whether runs' children go out as a chord: only with Redis's backend, whose chord
    counting dtask's hand-crafted messages feed (a database backend would poll with
    ``chord_unlock`` tasks, ``rpc://`` or a cache would never call back)."""
    return isinstance(current().backend, RedisBackend)


def publish(
    children: Iterable[Redispatch],
    priority: int = RESEND,
    through: Any = None,
    batch: int = 1,
    countdown: float | None = None,
) -> int:
    """``send`` the children, consecutive children of one run ``batch`` to a message."""
    return send(_batches(children, batch), priority, through, countdown)


def send(
    messages: Iterable[list[Redispatch]],
    priority: int = RESEND,
    through: Any = None,
    countdown: float | None = None,
) -> int:
    """Send child messages through one producer, pipelined where the broker allows (Redis);
    returns how many children. Through ``through`` if given, else a producer from the app's
    pool. The children of each of ``messages`` (consecutive children of one run) go in one
    message (``dtask.children``), run one after the other by one pool process, each still
    claimed, fenced and finished on its own; a message of one is the ``dtask.child`` that
    ``child.apply_async`` would send.

    Each message is the one ``apply_async`` would send (same headers, body and properties,
    built by Celery's ``create_task_message``) minus the per-call overhead that dominates a
    large chord: routing, queue declaration, publish signals and the ``task-sent`` event per
    message, and one broker round trip each. A failed send raises; the children are in
    PostgreSQL, so the reaper re-sends them (the master's run stays ``splitting``).
    """
    app = current()
    chord = chords()
    sent = 0
    callbacks: dict[str, Any] = {}
    declared: dict[str, Any] = {}
    options = _priority(priority)
    parent = _parent_ids()

    def message(group: list[Redispatch]) -> Any:
        c = group[0]
        if len(group) > 1:
            return app.amqp.create_task_message(
                f"{c.group_id}.{c.index}+{len(group)}",
                CHILDREN,
                (c.run_id, c.template, c.group_id, c.queue, [[g.index, g.spec] for g in group]),
                None,
                ignore_result=True,
                reply_to=app.thread_oid,
                countdown=countdown,
                **parent,
                **readable_batch(group),
            )
        callback = callbacks.get(c.group_id)
        if callback is None and chord:
            callback = callbacks[c.group_id] = chord_callback(c.run_id, c.group_id)
        return app.amqp.create_task_message(
            child_task_id(c.group_id, c.index),
            CHILD,
            (c.run_id, c.index, c.template, c.spec),
            None,
            group_id=c.group_id,
            group_index=c.index,
            chord=callback,
            ignore_result=True,  # the chord still counts it; the outcome is in PostgreSQL
            reply_to=app.thread_oid,
            countdown=countdown,
            **parent,
            **readable(c.template, c.run_id, c.index, c.spec),
        )

    with app.producer_or_acquire(through) as producer, pipelined(producer, PUBLISH_BATCH):
        for whole in messages:
            name = whole[0].queue or DEFAULT_QUEUE
            queue = declared.get(name)
            if queue is None:
                queue = declared[name] = app.amqp.queues[name]
                producer.maybe_declare(queue)
            for group, (headers, properties, body) in _bounded(whole, message):
                producer.publish(
                    body,
                    exchange="",  # what Celery does for a direct queue: route by its name
                    routing_key=queue.name,
                    content_type=JSON,
                    content_encoding="utf-8",
                    delivery_mode=queue.exchange.delivery_mode,
                    headers=headers,
                    retry=False,
                    **options,
                    **properties,
                )
                sent += len(group)
    return sent


JSON = "application/json"


def _bounded(
    group: list[Redispatch], message: Callable[[list[Redispatch]], Any]
) -> Iterator[tuple[list[Redispatch], tuple[Any, Any, str]]]:
    """``group`` as messages of MESSAGE_BYTES at most, halved until each fits (a lone child
    goes as it is: its spec is bounded by DTASK_MAX_CHILD_SPEC), in index order; each with its
    headers, properties and JSON body, serialized once here rather than by the producer. The
    dispatcher's messages fit already (``dtask.domain.dispatch.messages``)."""
    stack = [group]
    while stack:
        part = stack.pop()
        headers, properties, body, _ = message(part)
        text: str = json.dumps(body)  # type: ignore[no-untyped-call]  # kombu's, as publish's
        if len(part) > 1 and len(text) > MESSAGE_BYTES:
            half = len(part) // 2
            stack += [part[half:], part[:half]]
            continue
        yield part, (headers, properties, text)


def pipelined(producer: Any, size: int) -> contextlib.AbstractContextManager[Any]:
    """The producer's publishes inside, sent ``size`` at a time in one round trip where kombu
    can (``Producer.batch``, kombu 5.7: a Redis pipeline); with an older kombu each goes out
    as it is published, as Celery sends them."""
    batch = getattr(producer, "batch", None)
    return batch(max_size=size) if batch is not None else contextlib.nullcontext()


def _batches(children: Iterable[Redispatch], size: int) -> Iterable[list[Redispatch]]:
    """Consecutive children of one run, ``size`` at most to a list."""
    group: list[Redispatch] = []
    for c in children:
        if group and (len(group) >= size or c.run_id != group[0].run_id):
            yield group
            group = []
        group.append(c)
    if group:
        yield group


PUBLISH_BATCH = 1000


def _parent_ids() -> dict[str, Any]:
    """root_id/parent_id as apply_async sets them when a task (the master) sends."""
    parent = current().current_worker_task
    if parent is None:
        return {}
    return {"root_id": parent.request.root_id or parent.request.id, "parent_id": parent.request.id}


def readable(template: str, run_id: int, index: int, spec: dict[str, Any]) -> dict[str, str]:
    """How a child shows in Flower and the logs: "print_range run 5 child 3", its spec (cut
    at Celery's own limit for the reprs it makes: a big spec never travels twice)."""
    amqp = current().amqp
    return {
        "argsrepr": f"{template} run {run_id} child {index}",
        "kwargsrepr": saferepr(spec, amqp.kwargsrepr_maxsize),
    }


def readable_batch(group: list[Redispatch]) -> dict[str, str]:
    """How a message of several children shows: "print_range run 5 children 0-49"."""
    first, last = group[0], group[-1]
    amqp = current().amqp
    # saferepr of a hundred specs cost a fifth of the dispatcher's time: the few that can
    # show, and how many there are
    shown = [c.spec for c in group[:SPECS_SHOWN]]
    more = f" and {len(group) - SPECS_SHOWN} more" if len(group) > SPECS_SHOWN else ""
    return {
        "argsrepr": f"{first.template} run {first.run_id} children {first.index}-{last.index}",
        "kwargsrepr": saferepr(shown, amqp.kwargsrepr_maxsize) + more,
    }


SPECS_SHOWN = 5  # of a message's children, in its kwargsrepr (Flower's task page)


def chord_callback(run_id: int, group_id: str) -> Any:
    finalize = current().signature(FINALIZE, args=(run_id,), immutable=True)
    return finalize.clone().set(
        task_id=f"{group_id}.finalize", link_error=[finalize], queue=DEFAULT_QUEUE
    )


def child_task_id(group_id: str, index: int) -> str:
    return f"{group_id}.{index}"
