"""Ports for the servers tests start: free ones, never a default a user (or the README's test,
which runs `dtask up` as written, on 8000 and 5555) may be using."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
