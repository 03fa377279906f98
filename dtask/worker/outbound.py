"""Outbound HTTP: the POSTs dtask makes to URLs it is given (a run's ``notify_url``, the
operator's ``DTASK_ALERT_WEBHOOK``), each bounded as a whole.

``urllib``'s ``timeout`` bounds each socket operation, not the call: a receiver that sends a
byte every few seconds held a worker's notifier for ever. Here one deadline covers the call:
the DNS lookup (in a thread, waited for only as long as is left), connect, the TLS handshake,
every send and every read, each given the time left (a read past the deadline is not made).
Besides:

- only ``http`` and ``https``; a redirect is not followed (a 3xx is a failed try);
- at most 64 KiB of the answer's head (status line and headers) and 64 KiB of its body are
  read; the status decides, the body is read only to be drained;
- without ``allow_private`` every address the host resolves to must be global (not loopback,
  private, link-local, unspecified, multicast or reserved: :func:`dtask.domain.notify.refusal`),
  and the connection goes to an address so checked: the host is resolved once, never again by
  the connect (no DNS rebinding between the check and the connection). HTTPS still checks the
  certificate against the host's name. Proxies (``HTTP(S)_PROXY``) are not used.

:func:`post` returns None when the receiver answered 2xx, else one line saying what went wrong.
The line names no part of the URL but its host (the alert webhook's path or query may hold a
secret).
"""

from __future__ import annotations

import base64
import http.client
import io
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from dtask.domain.notify import refusal

DEADLINE = 10.0  # seconds for one whole call: lookup, connect, send, answer
MAX_HEAD = 65_536  # bytes of status line and headers read at most
MAX_BODY = 65_536  # bytes of body read at most (then the connection is closed)
_PORTS = {"http": 80, "https": 443}

Address = tuple[int, Any]  # (socket family, socket address) as getaddrinfo gives them


class _Expired(Exception):
    """The call's deadline passed."""


class _TooLarge(Exception):
    """The answer went past what is read of it."""


def post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    deadline: float = DEADLINE,
    allow_private: bool = True,
    max_body: int = MAX_BODY,
) -> str | None:
    """POST ``body`` to ``url`` within ``deadline`` seconds in all: None when answered 2xx,
    else what went wrong, in one line."""
    end = time.monotonic() + deadline
    try:
        return _post(url, body, headers, end, allow_private, max_body)
    except (_Expired, TimeoutError):
        return f"no complete answer within the {deadline:g} s deadline"
    except _TooLarge:
        return f"the answer's status line and headers are over {MAX_HEAD} bytes"
    except ssl.SSLError as exc:
        detail = getattr(exc, "verify_message", None)  # why a certificate is not trusted
        return _line(f"TLS: {exc.reason or exc}" + (f" ({detail})" if detail else ""))
    except Exception as exc:  # whatever a receiver provokes is a failed try, never a crash
        return _line(f"{type(exc).__name__}: {exc}")


def _post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    end: float,
    allow_private: bool,
    max_body: int,
) -> str | None:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _PORTS or not parts.hostname:
        return "refused: only http:// and https:// URLs with a host are called"
    host = parts.hostname
    port = parts.port or _PORTS[scheme]
    addresses = _resolve(host, port, end)
    if not allow_private:
        for _, sockaddr in addresses:
            refused = refusal(ipaddress.ip_address(sockaddr[0]))
            if refused is not None and _literal(host):
                return f"refused: {refused}"  # "10.0.0.5 is a private address (...)"
            if refused is not None:  # "name resolves to 10.0.0.5, a private address (...)"
                return f"refused: {host} resolves to {', '.join(refused.split(' is ', 1))}"
    sock = _connect(addresses, end)
    try:
        if scheme == "https":
            sock.settimeout(_left(end))  # the handshake as a whole (ssl counts it down itself)
            sock = _tls().wrap_socket(sock, server_hostname=host)  # detaches the plain one
        wire = _Wire(sock, end)
        conn = _Connection(host, port, wire, https=scheme == "https")
        sent = dict(headers)
        sent.setdefault("Connection", "close")
        if parts.username is not None:
            login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            sent.setdefault("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("POST", path, body, sent)
        wire.limit = MAX_HEAD
        response = conn.getresponse()
        wire.limit = wire.read + max_body  # what the head's buffer holds of it, and this
        _drain(response, max_body)
        status = response.status
    finally:
        sock.close()
    if 200 <= status < 300:
        return None
    if 300 <= status < 400:
        return f"HTTP {status} (redirects are not followed)"
    return f"HTTP {status}"


def _left(end: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise _Expired
    return left


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _resolve(host: str, port: int, end: float) -> list[Address]:
    """The host's addresses, looked up once. A lookup may hang for as long as the resolver
    lets it, so it runs in a thread of its own, waited for only until the deadline (it then
    ends on its own, unheeded)."""
    if _literal(host):
        return _addresses(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    found: list[Any] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except Exception as exc:  # handed to the caller's thread
            found.append(exc)

    thread = threading.Thread(target=lookup, name="dtask lookup", daemon=True)
    thread.start()
    thread.join(_left(end))
    if not found:
        raise _Expired
    if isinstance(found[0], BaseException):
        if isinstance(found[0], socket.gaierror):
            raise OSError(f"cannot resolve the host: {found[0].strerror}") from found[0]
        raise found[0]
    return _addresses(found[0])


def _addresses(infos: list[Any]) -> list[Address]:
    unique: dict[Any, Address] = {}
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            unique.setdefault(sockaddr, (family, sockaddr))
    if not unique:
        raise OSError("the host has no IPv4 or IPv6 address")
    return list(unique.values())


def _connect(addresses: list[Address], end: float) -> socket.socket:
    """A connection to the first of ``addresses`` (those checked) that takes one in time."""
    error: OSError | None = None
    for family, sockaddr in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(_left(end))
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            error = exc
        except BaseException:
            sock.close()
            raise
    assert error is not None
    raise error


_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """The system's trusted certificates, loaded once (a context is safe to share)."""
    global _context
    if _context is None:
        _context = ssl.create_default_context()
    return _context


class _Wire:
    """The connected socket as http.client sees it, every send and read given the time left
    before the deadline, and reads stopped at ``limit`` bytes in all."""

    def __init__(self, sock: socket.socket, end: float) -> None:
        self.sock = sock
        self.end = end
        self.read = 0
        self.limit = MAX_HEAD

    def sendall(self, data: bytes) -> None:
        with memoryview(data) as view, view.cast("B") as octets:
            done = 0
            while done < len(octets):
                self.sock.settimeout(_left(self.end))
                done += self.sock.send(octets[done:])

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reader(self))

    def close(self) -> None:
        """Nothing: :func:`_post` closes the socket once it is done with the answer."""


class _Reader(io.RawIOBase):
    def __init__(self, wire: _Wire) -> None:
        self.wire = wire

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wire = self.wire
        room = wire.limit - wire.read
        if room <= 0:
            raise _TooLarge
        wire.sock.settimeout(_left(wire.end))
        with memoryview(buffer) as view, view.cast("B") as octets:
            got = wire.sock.recv_into(octets[:room])
        wire.read += got
        return got


class _Connection(http.client.HTTPConnection):
    """http.client's request writing and answer parsing (header and path checks included)
    over a socket already connected to a checked address: it never resolves or connects."""

    def __init__(self, host: str, port: int, wire: _Wire, https: bool) -> None:
        super().__init__(host, port)
        if https:
            self.default_port = 443  # the Host header leaves the scheme's own port out
        self.sock = cast(socket.socket, wire)

    def connect(self) -> None:
        raise http.client.HTTPException("no new connection: one try, one connection")


def _drain(response: http.client.HTTPResponse, max_body: int) -> None:
    """Read what is read of the body: the status has decided already, so a body cut short by
    the bound, the deadline or the receiver changes nothing."""
    left = max_body
    try:
        while left > 0:
            chunk = response.read(min(left, 16_384))
            if not chunk:
                return
            left -= len(chunk)
    except (_Expired, _TooLarge, OSError, http.client.HTTPException):
        return


def _line(text: str) -> str:
    return " ".join(text.split())[:300]
