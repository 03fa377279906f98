"""kombu before 5.7 has no ``Producer.batch``: dtask's publishes then go out one at a time
(`make test-floor` runs dtask on such a kombu; this runs on either)."""

from __future__ import annotations

from typing import Any

from dtask.worker.messages import pipelined


class OldProducer:
    """A producer as kombu 5.3 to 5.6 make it: publish, no batch."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def publish(self, body: str) -> None:
        self.sent.append(body)


class NewProducer(OldProducer):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def batch(self, max_size: int) -> Any:
        self.batches.append(max_size)
        return Batch(self)


class Batch:
    def __init__(self, producer: NewProducer) -> None:
        self.producer = producer

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.producer.sent.append("flush")


def test_an_old_producer_publishes_each_message_as_it_comes() -> None:
    producer = OldProducer()
    with pipelined(producer, 1000):
        producer.publish("a")
        assert producer.sent == ["a"]
        producer.publish("b")
    assert producer.sent == ["a", "b"]


def test_a_new_producer_pipelines_up_to_the_size() -> None:
    producer = NewProducer()
    with pipelined(producer, 8):
        producer.publish("a")
    assert producer.batches == [8]
    assert producer.sent == ["a", "flush"]
