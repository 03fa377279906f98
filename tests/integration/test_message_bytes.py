"""A message of children is cut where its body would pass MESSAGE_BYTES, whatever the batch
the dispatcher asked for: 400 children with specs near DTASK_MAX_CHILD_SPEC went as one 25 MiB
message, which RabbitMQ 4 refuses by default (max_message_size 16 MiB) on every re-send.
Published to the session's real broker and read back from it."""

from __future__ import annotations

import uuid
from typing import Any

from dtask.db.recovery import Redispatch
from dtask.worker import configure
from dtask.worker.app import app
from dtask.worker.messages import MESSAGE_BYTES, publish


def _indexes(message: Any) -> list[int]:
    args = message.decode()[0]
    if message.headers["task"] == "dtask.children":
        return [int(i) for i, _ in args[4]]
    return [int(args[1])]


def read_all(queue: str) -> list[Any]:
    got = []
    with app.connection_for_read() as conn, conn.SimpleQueue(queue) as simple:
        while True:
            try:
                message = simple.get(timeout=2)
            except simple.Empty:
                return got
            message.ack()
            got.append(message)


def test_a_message_of_large_children_is_cut_to_the_bound_and_keeps_their_order(
    dtask_env: dict[str, str],
) -> None:
    configure()
    queue = f"dtask.bytes-{uuid.uuid4().hex[:8]}"
    spec = {"pad": "x" * 20_000}
    children = [Redispatch(7, i, spec, "tiny", "g7", queue) for i in range(400)]
    assert publish(children, batch=400) == 400
    got = read_all(queue)
    sizes = [len(m.body) for m in got]
    assert max(sizes) <= MESSAGE_BYTES, sizes
    assert [i for m in got for i in _indexes(m)] == list(range(400))
    assert len(got) <= 16, sizes  # halved to fit, not sent one child a message


def test_small_children_still_go_the_batch_asked_for(dtask_env: dict[str, str]) -> None:
    configure()
    queue = f"dtask.bytes-{uuid.uuid4().hex[:8]}"
    children = [Redispatch(8, i, {"i": i}, "tiny", "g8", queue) for i in range(400)]
    assert publish(children, batch=400) == 400
    got = read_all(queue)
    assert [len(_indexes(m)) for m in got] == [400]
