"""Redis Sentinel discovery that remembers which sentinel answered, process-wide.

kombu makes a new ``redis.sentinel.Sentinel`` for each channel, and Celery one for each
result backend client; each asks the sentinels in the order of the URL. A sentinel that is
frozen (SIGSTOP, a hung VM: it accepts connections and never answers) then cost every new
connection a network timeout, and the dispatcher's and reaper's passes, which hold a turn
while they send, ran past their turns and stopped (docs/deployment.md). Here each new
``Sentinel`` starts with the one that last answered in this process (a forked child inherits
it), so a frozen sentinel costs a process one timeout, not one per connection. And a channel
closed after its primary died no longer ends the worker (``Channel._connparams``).
"""

from __future__ import annotations

from typing import Any

import redis
from celery.backends.redis import SentinelBackend
from kombu.transport.redis import SentinelChannel, SentinelTransport

Address = tuple[str, int]

_answered: dict[frozenset[Address], Address] = {}  # a set of sentinels -> the last to answer


def _address(sentinel: Any) -> Address:
    kwargs = sentinel.connection_pool.connection_kwargs
    return (str(kwargs.get("host")), int(kwargs.get("port", 0)))


def remembering(manager: Any) -> Any:
    """``manager`` (a ``redis.sentinel.Sentinel``) asking the sentinel that last answered
    first; whichever answers its discoveries is remembered for the next one."""
    key = frozenset(_address(s) for s in manager.sentinels)
    first = _answered.get(key)
    manager.sentinels.sort(key=lambda s: _address(s) != first)  # stable: the rest keep order
    discover = manager.discover_master

    def discover_master(service_name: str) -> Any:
        found = discover(service_name)
        _answered[key] = _address(manager.sentinels[0])  # redis-py moves the one that answered
        return found

    manager.discover_master = discover_master
    return manager


class Channel(SentinelChannel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection.client is None:
            # kombu 5.7 closing a channel after its connection is gone (the primary died with
            # a message unacked): it asks for a new pool to restore that message, and read the
            # missing connection's host, an AttributeError that killed the worker. As a
            # connection error the consumer ignores it and reconnects; the message stays in
            # the unacked set, restored by its visibility timeout (PostgreSQL has the child).
            raise redis.exceptions.ConnectionError("the broker connection is closed")
        return super()._connparams(asynchronous)  # type: ignore[no-untyped-call]

    def _sentinel_managed_pool(self, asynchronous: bool = False) -> Any:
        pool = super()._sentinel_managed_pool(asynchronous)  # type: ignore[no-untyped-call]
        remembering(pool.sentinel_manager)
        return pool


class Transport(SentinelTransport):
    """The broker's ``sentinel://`` transport (Celery's ``broker_transport``)."""

    Channel = Channel


class Backend(SentinelBackend):  # type: ignore[misc]
    """The result backend's ``sentinel://`` (``dtask.worker.sentinels:Backend+sentinel://``)."""

    def _get_sentinel_instance(self, **params: Any) -> Any:
        return remembering(super()._get_sentinel_instance(**params))
