"""Completion notification: a run's ``notify_url`` gets a POST of the run's JSON when it
finishes, signed with its client's secret, retried with backoff for an hour."""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from urllib.parse import urlsplit

from dtask.exceptions import InvalidNotifyUrl

SIGNATURE_HEADER = "X-Dtask-Signature"
RETRY_FOR = 3600.0  # seconds after the run finished: then the delivery is given up
MOST_BACKOFF = 300.0
MAX_URL = 2000


class Delivery(StrEnum):
    WAITING = "waiting"  # the run has not finished, or the delivery is being retried
    DELIVERED = "delivered"
    FAILED = "failed"  # given up after RETRY_FOR


def check_url(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_URL:
        raise InvalidNotifyUrl(
            f"notify_url must be an http(s) URL with a host, at most {MAX_URL} characters,"
            f" got {url[:100]!r}"
        )
    return url


def signature(secret: str, body: bytes) -> str:
    """What the receiver recomputes over the raw body to trust a notification."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff(attempts: int) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4 ... 300."""
    return min(MOST_BACKOFF, 2.0 ** min(max(0, attempts - 1), 30))
