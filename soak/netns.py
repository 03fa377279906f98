"""Network partitions for fault tests: a network namespace per process, links you can cut.

A process run in a :class:`Partition` (``ip netns exec``) reaches the services only through its
links: one veth pair per link, the host end carrying a :class:`Relay` that pipes TCP to the
real service (the embedded PostgreSQL and Redis listen on Unix sockets, which a namespace does
not hide, and nothing here listens on 0.0.0.0). ``cut`` sets the host end down: the process's
packets are dropped silently (no RST, no ICMP), as behind a dead switch or a firewall that
drops; ``heal`` sets it up again, and established connections carry on if neither side gave up.

Needs root and iproute2; :func:`unavailable` says why not when they are missing.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass, field

# Link subnets come from here, one /30 per link; the addresses exist only inside this machine
# (the host end and a namespace this process made).
_POOL = ipaddress.IPv4Network("10.213.0.0/16")
_counter = itertools.count()


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def unavailable() -> str | None:
    """Why partitions cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"dtprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except OSError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "delete", name)
    return None


def _used_subnets() -> set[ipaddress.IPv4Network]:
    used = set()
    for line in _ip("-o", "-4", "addr").splitlines():
        parts = line.split()
        if "inet" in parts:
            used.add(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_subnets()
    start = (os.getpid() * 7 + next(_counter) * 13) % 16384
    subnets = list(_POOL.subnets(new_prefix=30))
    for k in range(len(subnets)):
        subnet = subnets[(start + k) % len(subnets)]
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise OSError(f"no free /30 left in {_POOL}")


@dataclass
class Link:
    """One veth pair: ``host`` (the address the relays listen on) to ``guest`` (inside)."""

    host_dev: str
    host: str
    guest: str

    def cut(self) -> None:
        _ip("link", "set", self.host_dev, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_dev, "up")


@dataclass
class Partition:
    """A network namespace with named links to the host namespace."""

    name: str
    links: dict[str, Link] = field(default_factory=dict)

    @classmethod
    def create(cls, *link_names: str) -> Partition:
        tag = f"{os.getpid() % 100000}{next(_counter)}"
        part = cls(f"dtask-{tag}")
        _ip("netns", "add", part.name)
        try:
            _ip("-n", part.name, "link", "set", "lo", "up")
            for i, link_name in enumerate(link_names):
                part.links[link_name] = part._add_link(f"dt{tag}{i}")
        except BaseException:
            part.delete()
            raise
        return part

    def _add_link(self, dev: str) -> Link:
        subnet = _free_subnet()
        host, guest = (str(a) for a in list(subnet.hosts())[:2])
        host_dev, guest_dev = f"{dev}h", f"{dev}g"
        _ip("link", "add", host_dev, "type", "veth", "peer", "name", guest_dev)
        _ip("link", "set", guest_dev, "netns", self.name)
        _ip("addr", "add", f"{host}/30", "dev", host_dev)
        _ip("link", "set", host_dev, "up")
        _ip("-n", self.name, "addr", "add", f"{guest}/30", "dev", guest_dev)
        _ip("-n", self.name, "link", "set", guest_dev, "up")
        return Link(host_dev, host, guest)

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace (the same pid: ``ip netns exec`` execs it)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self, *link_names: str) -> None:
        for name in link_names or tuple(self.links):
            self.links[name].cut()

    def heal(self, *link_names: str) -> None:
        for name in link_names or tuple(self.links):
            self.links[name].heal()

    def delete(self) -> None:
        for link in self.links.values():
            with suppress(OSError):
                _ip("link", "delete", link.host_dev)  # deletes its peer too
        with suppress(OSError):
            _ip("netns", "delete", self.name)


Target = str | tuple[str, int]  # a Unix socket path, or (host, port)


def _keepalive(sock: socket.socket) -> None:
    # The relay's side of a connection whose guest vanished behind a cut must not live forever.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class Relay:
    """Listens on ``host`` (a free port) and pipes each TCP connection to ``target``."""

    def __init__(self, host: str, target: Target) -> None:
        self.target = target
        self._server = socket.create_server((host, 0))
        self.host, self.port = host, self._server.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"relay-{self.port}", daemon=True).start()

    def _connect(self) -> socket.socket:
        if isinstance(self.target, str):
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)  # fails while the service restarts
            except OSError:
                upstream.close()
                raise
            return upstream
        return socket.create_connection(self.target)

    def _accept(self) -> None:
        while not self._closed:
            try:
                guest, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:
                guest.close()
                continue
            _keepalive(guest)
            with self._lock:
                self._open.update((guest, upstream))
            for src, dst in ((guest, upstream), (upstream, guest)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        for sock in (src, dst):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            for sock in (src, dst):
                if sock in self._open:
                    self._open.discard(sock)
                    sock.close()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()
