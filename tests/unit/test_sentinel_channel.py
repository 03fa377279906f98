"""dtask's Sentinel channel (dtask/worker/sentinels.py) when kombu closes it after its
connection is gone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from dtask.worker.sentinels import Channel, Transport


def test_a_channel_closed_after_its_connection_raises_a_connection_error() -> None:
    """kombu 5.7's close asks for a pool to restore an unacked message once the primary died:
    as a ConnectionError (the consumer ignores those and reconnects), not the AttributeError
    that ended the worker (tests/acceptance/test_sentinel.py, the primary killed mid-run)."""
    closed = SimpleNamespace(connection=SimpleNamespace(client=None))
    with pytest.raises(redis.exceptions.ConnectionError, match="connection is closed"):
        Channel._connparams(closed)  # type: ignore[arg-type]
    assert issubclass(redis.exceptions.ConnectionError, Transport.connection_errors)
