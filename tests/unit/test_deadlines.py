from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dtask
from dtask.domain.deadlines import (
    MAX_COUNTDOWN,
    OnLate,
    check_delay_tolerance,
    check_queue,
    check_start,
    late_error,
    on_late_of,
)
from dtask.exceptions import InvalidDelayTolerance, InvalidStart


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "5", True])
def test_bad_delay_tolerances_are_refused(bad: object) -> None:
    with pytest.raises(InvalidDelayTolerance, match="run of template 't': delay tolerance"):
        check_delay_tolerance(bad, "run of template 't'")


def test_delay_tolerance_and_on_late() -> None:
    assert check_delay_tolerance(None, "x") is None
    assert check_delay_tolerance(30, "x") == 30.0
    assert on_late_of("fail", "x") is OnLate.FAIL
    with pytest.raises(InvalidDelayTolerance, match="on_late must be one of run, fail"):
        on_late_of("skip", "x")


def test_a_template_defined_with_a_bad_tolerance_fails_at_definition() -> None:
    with pytest.raises(InvalidDelayTolerance, match="template 'bad_tolerance'"):

        @dtask.template("bad_tolerance", split=lambda r: [{}], delay_tolerance=-5)
        def bad(ctx: dtask.ChildContext) -> None: ...


def test_the_late_error_says_what_happened() -> None:
    deadline = datetime(2026, 11, 23, 12, 0, 30, tzinfo=UTC)
    assert late_error(30.0, deadline) == (
        "not started within its delay tolerance of 30 s (deadline 2026-11-23T12:00:30+00:00):"
        " failed instead of running late"
    )


@given(st.floats(min_value=0, max_value=MAX_COUNTDOWN))
def test_a_countdown_in_range_is_kept(seconds: float) -> None:
    assert check_start(seconds, None, "run") == (None, seconds)


@pytest.mark.parametrize(
    ("countdown", "eta", "says"),
    [
        (-1, None, "countdown must be 0 to"),
        (float("nan"), None, "countdown must be 0 to"),
        (float("inf"), None, "countdown must be 0 to"),
        (1e80, None, "countdown must be 0 to"),
        ("5", None, "countdown must be a number of seconds"),
        (True, None, "countdown must be a number of seconds"),
        (None, "2026-01-01", "eta must be a datetime"),
        (1, datetime(2026, 1, 1, tzinfo=UTC), "give countdown or eta, not both"),
    ],
)
def test_bad_starts_are_refused_in_one_line(countdown: object, eta: object, says: str) -> None:
    with pytest.raises(InvalidStart, match=says):
        check_start(countdown, eta, "run of template 't'")


def test_a_naive_eta_means_utc_and_an_aware_one_is_kept() -> None:
    naive = datetime(2026, 11, 24, 12, 0)
    assert check_start(None, naive, "run") == (naive.replace(tzinfo=UTC), None)
    aware = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    assert check_start(None, aware, "run") == (aware, None)


@pytest.mark.parametrize("queue", ["", "   ", "q" * 201, 5])
def test_bad_queue_names_are_refused(queue: object) -> None:
    with pytest.raises(InvalidStart, match="queue must be a name"):
        check_queue(queue, "run")
    assert check_queue("gpu", "run") == "gpu" and check_queue(None, "run") is None
