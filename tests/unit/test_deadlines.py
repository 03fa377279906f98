from __future__ import annotations

from datetime import UTC, datetime

import pytest

import dtask
from dtask.domain.deadlines import OnLate, check_delay_tolerance, late_error, on_late_of
from dtask.exceptions import InvalidDelayTolerance


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
