"""Hostile webhook receivers on 127.0.0.1 (a free port, picked by binding to port 0): one that
trickles its answer a byte at a time for ever, one that redirects, one whose answer never ends.
Each records its connections: when it was made, when the caller hung up, what it sent."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType


@dataclass
class Connection:
    accepted: float  # time.monotonic()
    request: bytes = b""
    closed: float | None = None  # when the caller hung up (or the server closed it)
    sent: int = 0  # bytes of answer written


def read_request(conn: socket.socket) -> bytes:
    """The request's head and its body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def hung_up(conn: socket.socket, wait: float) -> bool:
    """Whether the caller closed its end (waiting up to ``wait`` seconds to see)."""
    readable, _, _ = select.select([conn], [], [], wait)
    if not readable:
        return False
    try:
        return conn.recv(65536) == b""
    except OSError:
        return True


class RawServer:
    """Accepts connections and hands each, with its record, to ``answer`` in a thread."""

    def __init__(
        self,
        answer: Callable[[socket.socket, Connection], None],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.answer = answer
        self.tls = tls
        self.connections: list[Connection] = []
        self._open: list[socket.socket] = []
        self._closing = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            record = Connection(time.monotonic())
            self.connections.append(record)
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn, record), daemon=True).start()

    def _serve(self, conn: socket.socket, record: Connection) -> None:
        try:
            if self.tls is not None:
                conn.settimeout(30)
                conn = self.tls.wrap_socket(conn, server_side=True)
            record.request = read_request(conn)
            self.answer(conn, record)
        except OSError:
            pass
        finally:
            if record.closed is None:
                record.closed = time.monotonic()
            conn.close()

    def open_connections(self) -> int:
        return sum(1 for c in self.connections if c.closed is None)

    def close(self) -> None:
        self._closing = True
        self.listener.close()
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Trickler(RawServer):
    """Answers a status line, then one byte of a header every ``every`` seconds, for ever (until
    the caller hangs up): each read gets a byte well within any per-read timeout."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        super().__init__(self._trickle)

    def _trickle(self, conn: socket.socket, record: Connection) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Trickle: ")
        record.sent = 29
        while not self._closing:
            if hung_up(conn, self.every):
                record.closed = time.monotonic()
                return
            conn.sendall(b"a")
            record.sent += 1


class Redirector(RawServer):
    """Answers every POST with a redirect to ``location``."""

    def __init__(self, location: str, status: int = 302) -> None:
        self.location = location
        self.status = status
        super().__init__(self._redirect)

    def _redirect(self, conn: socket.socket, record: Connection) -> None:
        conn.sendall(
            f"HTTP/1.1 {self.status} Found\r\nLocation: {self.location}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        hung_up(conn, 5)


class Flood(RawServer):
    """Answers ``status`` with a body (or, with ``in_headers``, a header) that never ends,
    written as fast as the caller takes it; records how much went out before the hang-up."""

    def __init__(self, status: int = 200, in_headers: bool = False) -> None:
        self.status = status
        self.in_headers = in_headers
        super().__init__(self._flood)

    def _flood(self, conn: socket.socket, record: Connection) -> None:
        if self.in_headers:
            conn.sendall(f"HTTP/1.1 {self.status} OK\r\nX-Flood: ".encode())
        else:
            conn.sendall(
                f"HTTP/1.1 {self.status} OK\r\nContent-Length: 100000000000\r\n\r\n".encode()
            )
        chunk = b"x" * 65536
        conn.settimeout(30)
        while not self._closing:
            conn.sendall(chunk)
            record.sent += len(chunk)


class Plain(RawServer):
    """Answers ``status`` to every POST; ``got`` holds each request (head and body)."""

    def __init__(self, status: int = 200, tls: ssl.SSLContext | None = None) -> None:
        self.status = status
        self.got: list[bytes] = []
        super().__init__(self._plain, tls)

    def _plain(self, conn: socket.socket, record: Connection) -> None:
        self.got.append(record.request)
        head = f"HTTP/1.1 {self.status} OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
        conn.sendall(head.encode() + b"ok")
        hung_up(conn, 5)


class Silent(RawServer):
    """Takes the connection, then says nothing (not even a TLS handshake) until hung up on."""

    def __init__(self) -> None:
        super().__init__(self._wait)

    def _wait(self, conn: socket.socket, record: Connection) -> None:
        while not self._closing and not hung_up(conn, 0.5):
            pass
