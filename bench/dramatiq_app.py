"""Dramatiq as its users run it, on the benchmark's Redis: a no-op actor and a group's
completion callback (GroupCallbacks, with Redis as its counter). With DTASK_BENCH_AMQP_URL set
(bench.peers --broker amqp) the messages go through RabbitMQ instead (its RabbitmqBroker) while
the group's counter and the callback's mark stay on the embedded Redis.

    dramatiq bench.dramatiq_app --processes 2 --threads 1
"""

from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend

AMQP_URL = os.environ.get("DTASK_BENCH_AMQP_URL")
QUEUES = ("default", "default.DQ", "default.XQ")  # its RabbitMQ queues (delay, dead letters)

broker: dramatiq.Broker
if AMQP_URL:
    broker = RabbitmqBroker(url=AMQP_URL)
    store = redis.Redis(unix_socket_path=os.environ["DTASK_BENCH_REDIS_SOCKET"])
else:
    broker = RedisBroker(
        unix_socket_path=os.environ["DTASK_BENCH_REDIS_SOCKET"], namespace="dramatiq-bench"
    )
    store = broker.client
broker.add_middleware(GroupCallbacks(RedisBackend(client=store)))
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=0)
def child(a: int, b: int) -> None:
    return None


@dramatiq.actor(max_retries=0)
def done(key: str) -> None:
    store.set(key, repr(time.time()))
