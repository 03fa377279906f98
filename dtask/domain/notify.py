"""Completion notification: a run's ``notify_url`` gets a POST of the run's JSON when it
finishes, signed with its client's secret, retried with backoff for an hour."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from enum import StrEnum
from urllib.parse import urlsplit

from dtask.domain.limits import shown
from dtask.exceptions import InvalidNotifyUrl

SIGNATURE_HEADER = "X-Dtask-Signature"
RETRY_FOR = 3600.0  # seconds after the run finished: then the delivery is given up
MOST_BACKOFF = 300.0
MAX_URL = 2000
ALLOW_PRIVATE = "DTASK_NOTIFY_ALLOW_PRIVATE"  # the setting that lets notify_url be private


class Delivery(StrEnum):
    WAITING = "waiting"  # the run has not finished, or the delivery is being retried
    DELIVERED = "delivered"
    FAILED = "failed"  # given up after RETRY_FOR


def check_url(url: str | None, *, allow_private: bool = True) -> str | None:
    """The URL, if a client may give it. Without ``allow_private`` (DTASK_NOTIFY_ALLOW_PRIVATE
    off) a host written as an IP address must be a global one; a host name is checked where it
    is resolved, at each delivery (no DNS here)."""
    if url is None:
        return None
    wanted = (
        f"notify_url must be an http(s) URL with a host, at most {MAX_URL} characters, no"
        " spaces or control characters, its port from 1 to 65535 and an IPv6 address in"
        " brackets (http://[::1]:8080/hook)"
    )
    if not isinstance(url, str):
        raise InvalidNotifyUrl(f"{wanted}, got {shown(url)}")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError: not a number, or out of range
    except ValueError as exc:  # an unclosed [ or a bad IPv6 address, a bad port
        raise InvalidNotifyUrl(f"{wanted}, got {shown(url, 100)} ({exc})") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or len(url) > MAX_URL
        or port == 0
        or any(c.isspace() or not c.isprintable() for c in url)
    ):
        raise InvalidNotifyUrl(f"{wanted}, got {shown(url, 100)}")
    if not allow_private:
        try:
            address = ipaddress.ip_address(parts.hostname)
        except ValueError:
            return url  # a name
        refused = refusal(address)
        if refused is not None:
            raise InvalidNotifyUrl(f"notify_url refused: {refused}")
    return url


def refusal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a notification may not go to ``address`` unless DTASK_NOTIFY_ALLOW_PRIVATE allows
    it ("10.0.0.5 is a private address (...)"), or None for a global address. An IPv4 address
    written as IPv6 (``::ffff:10.0.0.5``) is judged as the IPv4 one."""
    judged: ipaddress.IPv4Address | ipaddress.IPv6Address = address
    shown = str(address)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        judged = address.ipv4_mapped
        shown = f"{address} ({judged})"
    for kind, holds in (
        ("unspecified", judged.is_unspecified),
        ("loopback", judged.is_loopback),
        ("link-local", judged.is_link_local),
        ("multicast", judged.is_multicast),
        ("reserved", judged.is_reserved),
        ("private", judged.is_private),  # RFC 1918, ULA fc00::/7, documentation, benchmarks
        ("non-global", not judged.is_global),  # e.g. shared address space, 100.64.0.0/10
    ):
        if holds:
            article = "an" if kind[0] in "aeiou" else "a"
            return f"{shown} is {article} {kind} address ({ALLOW_PRIVATE})"
    return None


def signature(secret: str, body: bytes) -> str:
    """What the receiver recomputes over the raw body to trust a notification."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4 ... 300."""
    return min(MOST_BACKOFF, 2.0 ** min(max(0, attempts - 1), 30))
