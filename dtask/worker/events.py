"""Task events, a batch at a time. Celery publishes a worker's buffered task events on the
event loop's next turn: in practice one publish per event or two (on Redis each also builds
a client), the largest share of a busy worker's main process (docs/benchmarks.md). Here they
go out every ``FLUSH_EVERY`` seconds, or at once when ``BUFFER_LIMIT`` wait, and when the
consumer stops: Flower and other monitors see them up to that much later, none fewer."""

from __future__ import annotations

from typing import Any

from celery import bootsteps

FLUSH_EVERY = 0.1  # seconds
BUFFER_LIMIT = 500  # events


class Batched:
    """``on_send_buffered`` for a consumer's event dispatcher: one flush per interval."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.due = False

    def __call__(self) -> None:
        if not self.due:
            self.due = True
            self.consumer.hub.call_later(FLUSH_EVERY, self.flush)

    def flush(self) -> None:
        self.due = False
        dispatcher = self.consumer.event_dispatcher
        if dispatcher is not None:
            dispatcher.flush()


class BatchedEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """After Celery's ``Events`` step (on every connection, it makes a new dispatcher)."""

    requires = ("celery.worker.consumer.events:Events",)

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if c.hub is None or dispatcher is None or dispatcher.on_send_buffered is None:
            return  # no event loop (eventlet, gevent, solo): Celery sends each event at once
        batched = Batched(c)
        dispatcher.on_send_buffered = batched
        dispatcher.buffer_limit = BUFFER_LIMIT

    def shutdown(self, c: Any) -> None:  # before Events closes the dispatcher
        if c.event_dispatcher is not None:
            c.event_dispatcher.flush()


def add_step(worker: Any) -> None:
    """Batched events on ``worker``'s consumer (a worker of dtask's app, as it starts)."""
    if BatchedEvents not in worker.app.steps["consumer"]:
        worker.app.steps["consumer"].add(BatchedEvents)
