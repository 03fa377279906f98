"""A TCP relay that can blackhole its link: ``cut`` stops every byte in both directions
without closing anything (no FIN, no RST), as a dropped link, a hung pooler or a frozen
server would; ``heal`` lets the held bytes through again.

Unlike a link set down (soak/netns.py, needs root), the relay's kernel still acknowledges what
the client sends, so no TCP timer of the client (``tcp_user_timeout``, keepalives) ever fires:
only a bound the client keeps on its own clock notices the cut. A connection opened during the
cut is accepted (the kernel completes the handshake) and then hears nothing either.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from contextlib import suppress

Target = str | tuple[str, int]  # a Unix socket path, or (host, port)

_POLL = 0.05  # how often a pump looks at the cut while it waits


class BlackholeRelay:
    """Listens on 127.0.0.1 (a free port) and pipes each connection to ``target``."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(_POLL)  # close() does not wake an accept() blocked for ever
        self.port: int = self._server.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def cut(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._server.close()
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        with self._lock:
            for sock in self._open:
                sock.close()
            self._open.clear()

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _wait_flowing(self) -> bool:
        """Hold while cut; False once the relay closes."""
        while not self._flowing.wait(_POLL):
            pass
        return not self._closed.is_set()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                upstream.close()
                raise
            return upstream
        return socket.create_connection(self.target, timeout=10)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                self._open.add(client)
            self._start(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        if not self._wait_flowing():  # a connection made during the cut hears nothing
            return
        try:
            upstream = self._connect()
        except OSError:
            self._drop(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.add(upstream)
        self._start(self._pump, upstream, client)
        self._pump(client, upstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while self._wait_flowing():
                ready, _, _ = select.select([src], [], [], _POLL)
                if not ready or not self._wait_flowing():
                    continue
                chunk = src.recv(65536)
                if not chunk:
                    break
                if not self._wait_flowing():  # read just as the cut came: held until the heal
                    break
                dst.sendall(chunk)
        except (OSError, ValueError):  # closed under it
            pass
        self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                if sock in self._open:
                    self._open.discard(sock)
                    sock.close()
