"""Task events reach monitors (Flower) batched: a busy worker's main process publishes them a
batch at a time, not one publish per event or two (dtask/worker/events.py)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

import dtask
from dtask import services
from tests.conftest import WorkerProcess
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance


class Listener(threading.Thread):
    """Every task-event message published on the broker (Redis pub/sub, as Flower reads it)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.pubsub = redis.Redis.from_url(url).pubsub()
        self.pubsub.psubscribe("*celeryev/task.multi")
        self.batches: list[list[dict[str, Any]]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            message = self.pubsub.get_message(timeout=0.2)
            if message is None or message["type"] != "pmessage":
                continue
            envelope = json.loads(message["data"])
            body = envelope["body"]
            if envelope["properties"].get("body_encoding") == "base64":
                body = base64.b64decode(body)
            events = json.loads(body)
            self.batches.append(events if isinstance(events, list) else [events])

    def succeeded(self) -> int:
        return sum(e["type"] == "task-succeeded" for b in list(self.batches) for e in b)


def test_task_events_go_out_a_batch_at_a_time_and_none_is_lost(
    dtask_env: dict[str, str],
    workers: list[WorkerProcess],
    settings_from: Callable[[dict[str, str]], None],
) -> None:
    settings_from({"DTASK_PICKUP": "0"})  # a master task per run: the events to count
    url = services.ensure_broker().broker_url
    if not url.startswith(("redis://", "rediss://", "redis+socket://", "unix://")):
        pytest.skip(f"reads events from Redis pub/sub; the broker is {url.split(':')[0]}")
    listener = Listener(url.replace("redis+socket://", "unix://"))
    listener.start()
    try:
        runs = [dtask.submit("task_name", {"n": 1}) for _ in range(60)]
        for run in runs:
            assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
        # every master's task-succeeded arrives (the last batch within the flush interval)
        wait_for(lambda: listener.succeeded() >= len(runs), 60, "every task-succeeded event")
    finally:
        listener.stopping.set()
        listener.join(timeout=10)
    events = sum(len(b) for b in listener.batches)
    per_message = events / len(listener.batches)
    print(f"\n{events} task events in {len(listener.batches)} messages ({per_message:.1f} each)")
    assert per_message >= 4, per_message
