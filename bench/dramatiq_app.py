"""Dramatiq as its users run it, on the benchmark's Redis: a no-op actor and a group's
completion callback (GroupCallbacks, with Redis as its counter).

    dramatiq bench.dramatiq_app --processes 2 --threads 1
"""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend

broker = RedisBroker(
    unix_socket_path=os.environ["DTASK_BENCH_REDIS_SOCKET"], namespace="dramatiq-bench"
)
broker.add_middleware(GroupCallbacks(RedisBackend(client=broker.client)))
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def child(a: int, b: int) -> None:
    return None


@dramatiq.actor(max_retries=0)
def done(key: str) -> None:
    broker.client.set(key, repr(time.time()))
