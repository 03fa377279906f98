"""Random strings, bytes, numbers, dates, zones and sizes thrown at `dtask submit`, `dtask
schedule add` and `dtask client set` (in this process, against a real PostgreSQL): each call
exits 0 or 2 with one line, never a traceback; a refused call leaves no run and no schedule,
and every later `dtask runs` / `dtask schedule list` still works."""

from __future__ import annotations

import contextlib
import io
import string
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtask import services
from dtask.cli import main
from dtask.db.database import sql

# what a shell can hand a command: any text, undecodable bytes (as Python sees argv), numbers
ARG = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=string.printable, min_size=280, max_size=400),
    st.binary(min_size=1, max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.sampled_from(["nan", "inf", "-inf", "1e20", "1e80", "-1", "0", "9" * 30, "", " "]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.datetimes().map(lambda d: d.isoformat()),
    st.sampled_from(["9999-12-31T23:59:59", "0001-01-01T00:00:00", "1969-12-31T23:59:59"]),
    st.sampled_from(["UTC", "Pacific/Kiritimati", "America/New_York", "A" * 300, "../etc"]),
)


def call(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own errors
            code = int(exc.code or 0)
    return code, err.getvalue()


def counts() -> tuple[int, int, int]:
    with services.store().runs.db.tx() as conn:
        row = conn.execute(
            sql(
                "SELECT (SELECT count(*) FROM dtask_runs) AS runs,"
                " (SELECT count(*) FROM dtask_schedules) AS schedules,"
                " (SELECT count(*) FROM dtask_clients) AS clients"
            )
        ).one()
    return int(row.runs), int(row.schedules), int(row.clients)


@pytest.fixture(scope="module")
def made(dtask_env: dict[str, str]) -> Iterator[None]:
    yield
    with services.store().runs.db.tx() as conn:  # what the fuzzing saved, so others start clean
        conn.execute(sql("DELETE FROM dtask_schedules WHERE name LIKE 'fz%'"))
        conn.execute(sql("DELETE FROM dtask_clients WHERE name LIKE 'fz%'"))


def check(argv: list[str], creates: int) -> None:
    before = counts()
    code, err = call(*argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        assert err.startswith("dtask: error: ") and err.count("\n") == 1, (argv, err)
        assert counts() == before, (argv, err)  # nothing half-created
    assert call("runs", "--limit", "3")[0] == 0
    assert call("schedule", "list")[0] == 0, argv


OPTIONS = ["--key", "--priority", "--delay-tolerance", "--execution-cap", "--after", "--tier"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=ARG, options=st.lists(st.tuples(st.sampled_from(OPTIONS), ARG), max_size=3))
def test_submit_exits_0_or_2_and_never_half_creates(
    made: None, n: str, options: list[tuple[str, str]]
) -> None:
    argv = ["submit", "print_range", "-e", f"n={n}"]
    for option, value in options:
        argv += [f"{option}={value}"]
    check(argv, creates=1)


SCHEDULE_OPTIONS = ["--tz", "--start", "--end", "--grace", "--catch-up-window", "--misfire"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.one_of(st.from_regex(r"fz[a-z0-9]{1,8}", fullmatch=True), ARG),
    when=st.one_of(
        st.tuples(st.just("--every"), ARG),
        st.tuples(st.just("--cron"), st.one_of(ARG, st.sampled_from(["0 3 * * *", "@daily"]))),
    ),
    options=st.lists(st.tuples(st.sampled_from(SCHEDULE_OPTIONS), ARG), max_size=3),
)
def test_schedule_add_exits_0_or_2_and_never_saves_what_cannot_be_listed(
    made: None, name: str, when: tuple[str, str], options: list[tuple[str, str]]
) -> None:
    argv = ["schedule", "add", name, "print_range", "-e", "n=5", f"{when[0]}={when[1]}"]
    for option, value in options:
        argv += [f"{option}={value}"]
    check(argv, creates=1)
    if not name.startswith("fz"):
        call("schedule", "rm", name)  # a name the fuzzer made up and that was saved


CLIENT_OPTIONS = ["--rate", "--child-rate", "--max-running", "--weight", "--max-priority", "--tier"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    options=st.lists(
        st.tuples(st.sampled_from(CLIENT_OPTIONS), ARG),
        min_size=1,
        max_size=3,
    )
)
def test_client_set_exits_0_or_2(made: None, options: list[tuple[str, str]]) -> None:
    argv = ["client", "set", "fzclient"]
    for option, value in options:
        argv += [f"{option}={value}"]
    check(argv, creates=1)
