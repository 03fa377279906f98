"""A hostile upload on a raw socket: a body of any announced size (Content-Length or chunked)
streamed while the answer is watched for, as curl does, so a server that answers before the
body ends is seen to do so, and one that reads on is given up on."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

PIECE = 64 * 1024


@dataclass
class Upload:
    status: int | None  # None: no answer before the upload was given up
    sent: int  # body bytes the kernel took before the answer came (or all of them)
    seconds: float  # from the head's sending to the answer's first byte
    closed: bool  # the server closed the connection after its answer
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None


def upload(
    base: str,
    method: str,
    path: str,
    token: str | None,
    size: int,
    chunked: bool,
    give_up_after: int,
) -> Upload:
    """Send ``size`` bytes of body (never more than ``give_up_after``) until an answer
    comes; a server that reads everything gets the end of the body (``0`` for chunked)."""
    url = urllib.parse.urlsplit(base)
    head = [f"{method} {url.path}{path} HTTP/1.1", f"Host: {url.netloc}"]
    head.append("Content-Type: application/json")
    if token:
        head.append(f"Authorization: Bearer {token}")
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    with socket.create_connection((url.hostname, url.port or 80), timeout=60) as sock:
        start = time.monotonic()
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent, answered = _stream(sock, size, chunked, min(size, give_up_after))
        seconds = time.monotonic() - start
        sock.setblocking(True)
        sock.settimeout(60 if answered or sent == size else 5)
        data, closed = _read(sock)
    return _parsed(data, sent, seconds, closed)


def _stream(sock: socket.socket, size: int, chunked: bool, most: int) -> tuple[int, bool]:
    """(body bytes sent, whether an answer came first)."""
    sock.setblocking(False)
    out, sent = b"", 0
    while True:
        if not out:
            if sent >= most:
                if sent == size and chunked:
                    sock.setblocking(True)
                    sock.sendall(b"0\r\n\r\n")
                return sent, False
            piece = b"x" * min(PIECE, most - sent)
            out = f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece
            sent += len(piece)
        readable, writable, _ = select.select([sock], [sock], [], 60)
        if readable or not writable:
            return sent, bool(readable)
        try:
            out = out[sock.send(out) :]
        except (BrokenPipeError, ConnectionResetError):
            return sent, True


def _read(sock: socket.socket) -> tuple[bytes, bool]:
    """What the server sent, and whether it then closed the connection."""
    data = b""
    try:
        while True:
            got = sock.recv(65536)
            if not got:
                return data, True
            data += got
    except ConnectionResetError:
        return data, True
    except TimeoutError:
        return data, False


def _parsed(data: bytes, sent: int, seconds: float, closed: bool) -> Upload:
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head:
        return Upload(None, sent, seconds, closed)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    length = int(headers.get("content-length", len(rest)))
    body = json.loads(rest[:length]) if length else None
    return Upload(int(lines[0].split()[1]), sent, seconds, closed, headers, body)


def trickle(
    base: str, path: str, token: str | None, size: int, every: float, give_up: float
) -> Upload:
    """A POST of ``size`` bytes (Content-Length) sent one byte every ``every`` seconds until an
    answer comes or ``give_up`` seconds have passed: a body that never quite stops."""
    url = urllib.parse.urlsplit(base)
    head = [f"POST {url.path}{path} HTTP/1.1", f"Host: {url.netloc}"]
    head += ["Content-Type: application/json", f"Content-Length: {size}"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    with socket.create_connection((url.hostname, url.port or 80), timeout=60) as sock:
        start = time.monotonic()
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        while sent < size and time.monotonic() - start < give_up:
            if select.select([sock], [], [], every)[0]:
                break  # an answer (or the close) came
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
        seconds = time.monotonic() - start
        sock.settimeout(5)
        data, closed = _read(sock)
    return _parsed(data, sent, seconds, closed)
