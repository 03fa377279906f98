from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.clients import Client, Rate, Tier, refusal, retry_after
from dtask.exceptions import InvalidClient, RateLimited

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "count", "seconds"),
    [("50/m", 50, 60), ("1/s", 1, 1), (" 7 / h ", 7, 3600), ("100000/d", 100_000, 86400)],
)
def test_rates_parse(text: str, count: int, seconds: int) -> None:
    rate = Rate.parse(text)
    assert (rate.count, rate.seconds) == (count, seconds)


@pytest.mark.parametrize("text", ["50", "50/min", "0/m", "-1/m", "x/m", "50/w", "", "5.5/m"])
def test_bad_rates_say_what_a_rate_looks_like(text: str) -> None:
    with pytest.raises(InvalidClient, match=r"N/PERIOD .* one of s, m, h, d \(for example 50/m\)"):
        Rate.parse(text)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_running": 0}, "max_running must be a whole number from 1 to 2,147,483,647"),
        ({"max_running": 2**31}, "max_running must be a whole number from 1 to"),
        ({"weight": 0}, "weight must be a number above 0"),
        ({"weight": True}, "weight must be a number above 0"),
        ({"max_priority": 10}, r"max_priority must be a whole number from 0 \(lowest\) to 9"),
        ({"tier": "gold"}, "tier must be one of basic, regular, premium"),
        ({"colour": "red"}, r"unknown client setting\(s\): colour"),
    ],
)
def test_bad_settings_are_refused_with_one_line(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidClient, match=message):
        Client("acme").changed(**settings)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 101, "naïve"])
def test_bad_client_names(name: str) -> None:
    with pytest.raises(InvalidClient, match="client name"):
        Client(name)


def test_changed_parses_and_keeps_what_is_not_given() -> None:
    client = Client("acme").changed(rate="50/m", tier="premium")
    client = client.changed(max_running=2)
    assert (client.rate, client.tier, client.max_running) == (Rate(50, "m"), Tier.PREMIUM, 2)
    assert client.changed(rate=None).rate is None


def test_priority_is_capped_by_the_client() -> None:
    client = Client("acme", max_priority=6)
    assert [client.priority_for(p) for p in (None, 0, 6, 9)] == [5, 0, 6, 6]
    with pytest.raises(InvalidClient, match="priority must be a whole number from 0"):
        client.priority_for(10)


def test_refusals_say_limit_exceeded_and_when_to_retry() -> None:
    soon = refusal(Rate(50, "m"), "runs", 1, 12.2, "acme")
    assert isinstance(soon, RateLimited) and soon.exit_code == 4 and soon.retry_after == 13
    assert str(soon) == "limit exceeded: client 'acme' may submit 50/m runs; retry in 13 s"
    never = refusal(Rate(100, "h"), "children", 500, math.inf, "acme")
    assert "limit exceeded" in str(never) and "can never be accepted" in str(never)
    assert "--child-rate" in str(never)


windows = st.lists(
    st.tuples(st.floats(min_value=0.001, max_value=0.999), st.integers(1, 20)), max_size=30
)


@given(windows, st.integers(1, 60), st.integers(1, 80), st.sampled_from(["s", "m", "h"]))
def test_retry_after_is_the_earliest_moment_the_cost_fits(
    entries: list[tuple[float, int]], count: int, cost: int, period: str
) -> None:
    limit = Rate(count, period)
    # entries accepted within the last period, oldest first
    window = sorted((NOW - timedelta(seconds=limit.seconds * age), c) for age, c in entries)

    def fits_at(t: datetime) -> bool:
        still_in = sum(c for at, c in window if at + timedelta(seconds=limit.seconds) > t)
        return still_in + cost <= count

    wait = retry_after(window, limit, cost, NOW)
    if wait is None:
        assert fits_at(NOW)
    elif math.isinf(wait):
        assert cost > count
    else:
        assert wait > 0 and not fits_at(NOW)
        assert fits_at(NOW + timedelta(seconds=wait))
        assert not fits_at(NOW + timedelta(seconds=wait) - timedelta(microseconds=10))
