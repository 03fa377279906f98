"""Completion notification, the pure part: which URLs, the signature, the retry backoff."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.notify import MOST_BACKOFF, backoff, check_url, signature
from dtask.exceptions import DtaskError


def test_the_signature_is_the_hmac_sha256_of_the_raw_body() -> None:
    body = b'{"id": 1, "state": "succeeded"}'
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert signature("s3cret", body) == f"sha256={expected}"
    assert signature("other", body) != signature("s3cret", body)


def test_retries_back_off_doubling_up_to_five_minutes() -> None:
    assert [backoff(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


@given(st.integers(min_value=0, max_value=10_000))
def test_backoff_never_exceeds_its_bound(attempts: int) -> None:
    assert 1 <= backoff(attempts) <= MOST_BACKOFF


@pytest.mark.parametrize("url", ["https://hooks.example.com/dtask", "http://127.0.0.1:9/x?y=1"])
def test_http_urls_with_a_host_are_accepted(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(
    "url", ["ftp://host/x", "https://", "not a url", "file:///etc/passwd", "http://h/" + "x" * 2000]
)
def test_anything_else_is_one_clear_error(url: str) -> None:
    with pytest.raises(DtaskError, match="notify_url must be an http"):
        check_url(url)
