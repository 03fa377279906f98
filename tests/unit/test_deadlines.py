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


@pytest.mark.parametrize(
    "bad", [1e12, 1e16, MAX_COUNTDOWN + 1, pytest.param(10**5000, id="10**5000"), 2**63]
)
def test_a_delay_tolerance_past_ten_years_is_refused_with_its_bound(bad: object) -> None:
    with pytest.raises(InvalidDelayTolerance, match="at most 315,360,000 seconds, got"):
        check_delay_tolerance(bad, "run")


MOMENTS = st.datetimes(
    timezones=st.one_of(st.none(), st.timezones(), st.sampled_from([UTC])),
    allow_imaginary=True,
)
NUMBERS = st.one_of(
    st.floats(), st.integers(), st.sampled_from([MAX_COUNTDOWN, MAX_COUNTDOWN + 1e-6, 1e12])
)


@given(eta=MOMENTS, tolerance=NUMBERS, countdown=NUMBERS)
def test_every_deadline_and_start_that_passes_the_checks_is_a_readable_moment(
    eta: datetime, tolerance: object, countdown: object
) -> None:
    """What dtask stores is derived from these: the deadline (eta or now, plus the delay
    tolerance) and the start (eta, or now plus the countdown). Whatever passes the checks
    makes moments psycopg and datetime can read: before 9999 in UTC and in any offset."""
    from datetime import timedelta

    from dtask.exceptions import DtaskError

    now = datetime.now(UTC)
    try:
        seconds = check_delay_tolerance(tolerance, "run")
        start_at, _ = check_start(None, eta, "run")
        _, start_in = check_start(countdown, None, "run")
    except DtaskError as exc:
        assert "\n" not in str(exc)
        return
    assert seconds is not None and start_at is not None and start_in is not None
    latest = max(start_at, now + timedelta(seconds=start_in)) + timedelta(seconds=seconds)
    assert (latest + timedelta(hours=14)).year < 9999


@pytest.mark.parametrize(
    "eta",
    [
        datetime(9000, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
        datetime(1, 1, 1, 0, 30),
        datetime(9999, 12, 31, 23, 0),
    ],
)
def test_an_eta_outside_1970_to_8999_is_refused(eta: datetime) -> None:
    with pytest.raises(InvalidStart, match="eta must lie between 1970 and 8999"):
        check_start(None, eta, "run")
