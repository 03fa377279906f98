"""A fuzz of what callers hand dtask, on its three surfaces at once (issue 35): the Python API
(`dtask.submit`, `dtask.add_schedule`), the HTTP API (a non-admin token's `POST /runs`, an
admin's `PUT /schedules/{name}`) and the command line. Random text, numbers at and past every
bound, dates at the edges, huge and nested JSON. For every call: a result, or one line (one
`DtaskError`, exit 2, one JSON error with a 4xx status), never a traceback or a 500; a refused
call creates nothing; every listing still reads. After each test: an ordinary run of another
client is dispatched and finishes (the property that found a deadline in the year 33715).

`make test` runs 40 examples a surface; a larger run: `DTASK_FUZZ_EXAMPLES=1000 .venv/bin/pytest
tests/acceptance/test_fuzz_surfaces.py` (about 3 minutes per thousand on this 2-core box). Its
shapes (URLs, option spellings, bodies, settings, TOML) are in test_fuzz_shapes.py and
tests/unit/test_bad_shapes.py; `python -m tests.fuzz --minutes 10` runs all three for ten minutes
and prints what each call became."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dtask
from dtask import services
from dtask.db.database import sql
from dtask.domain.limits import MAX_SECONDS
from dtask.exceptions import DtaskError
from tests.acceptance.test_no_input_stops import another_client_finishes
from tests.conftest import WorkerProcess
from tests.integration.test_hostile_input import call as cli
from tests.support.api import call, call_raw, start_server, token
from tests.support.shapes import tally, url

pytestmark = pytest.mark.acceptance

EXAMPLES = int(os.environ.get("DTASK_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# numbers at and past every bound dtask has (durations, counts, priorities, weights, ports)
EDGES = [0, -1, 1, 9, 10, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**30, 10**400]
EDGES += [MAX_SECONDS, MAX_SECONDS + 1]
NUMBER = st.one_of(
    st.sampled_from([*EDGES, 1e12, 1e16, 1e308, -1e308, 0.5, 5e-324]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(min_value=-(2**70), max_value=2**70),
)
MOMENT = st.one_of(
    st.datetimes(timezones=st.sampled_from([UTC, timezone(timedelta(hours=14)), None])),
    st.sampled_from(
        [
            datetime(9999, 12, 31, 23, tzinfo=timezone(-timedelta(hours=14))),
            datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
            datetime(8999, 12, 31, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
        ]
    ),
)
TEXT = st.one_of(
    st.text(max_size=30),
    st.text(min_size=290, max_size=320),
    st.sampled_from(["", " ", "\x00", "schedule:x:1", "a" * 2001, "UTC", "Pacific/Kiritimati"]),
)
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
N = st.one_of(st.integers(min_value=1, max_value=3000), NUMBER, TEXT, JSON)
# nesting deeper than Python recurses, as raw JSON text (hypothesis cannot print such a value)
DEEP = st.integers(min_value=1, max_value=100_000)


SUBMIT_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "delay_tolerance": NUMBER,
    "execution_cap": NUMBER,
    "countdown": NUMBER,
    "eta": MOMENT,
    "priority": NUMBER,
    "key": TEXT,
    "queue": TEXT,
    "tier": TEXT,
    "on_late": TEXT,
    "notify_url": st.one_of(TEXT, st.just("http://127.0.0.1:1/x"), url(["http", "https", ""])),
    "after": st.lists(NUMBER, max_size=3),
}
SCHEDULE_OPTIONS: dict[str, st.SearchStrategy[Any]] = {
    "every": NUMBER,
    "grace": NUMBER,
    "catch_up_window": NUMBER,
    "delay_tolerance": NUMBER,
    "start": MOMENT,
    "end": MOMENT,
    "tz": TEXT,
}


def _options(options: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=options)


def counts() -> tuple[int, int]:
    with services.store().runs.db.tx() as conn:
        row = conn.execute(
            sql(
                "SELECT (SELECT count(*) FROM dtask_runs) AS runs,"
                " (SELECT count(*) FROM dtask_schedules) AS schedules"
            )
        ).one()
    return int(row.runs), int(row.schedules)


def listings_read() -> None:
    """Every read that lists runs or schedules, and the dispatcher's own, still works."""
    store = services.store()
    store.runs.statuses(20)
    dtask.list_schedules()
    with store.dispatch.turn(hold_for=10, wait=5) as turn:
        if turn is not None:
            turn.demands()


@pytest.fixture(scope="module")
def api(
    dtask_env: dict[str, str],
    workers: list[WorkerProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, str]]:
    """A real `dtask serve`, a client's token and an admin's; afterwards, another client's
    ordinary run still finishes, and what the fuzz saved is removed."""
    dtask.set_client("fz-http")
    proc, base = start_server(dtask_env, tmp_path_factory.mktemp("fuzz") / "serve.log")
    try:
        yield base, token(dtask_env, "fz-http"), token(dtask_env, "fz-http", "--admin")
    finally:
        proc.stop()
        another_client_finishes("fz-bystander")
        with services.store().runs.db.tx() as conn:
            conn.execute(sql("DELETE FROM dtask_schedules WHERE name LIKE 'fz%'"))


def _one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, message


@FUZZ
@given(n=N, options=_options(SUBMIT_OPTIONS))
def test_python_submit_returns_a_run_or_one_dtask_error(
    api: tuple[str, str, str], n: Any, options: dict[str, Any]
) -> None:
    before = counts()
    try:
        run = dtask.submit("print_range", {"n": n}, client="fz-http", **options)
    except DtaskError as exc:
        tally("python submit", "refused" if counts() == before else "created")
        _one_line(str(exc))
        assert counts() == before, (options, exc)
    except Exception:
        tally("python submit", "traceback")
        raise
    else:
        tally("python submit", "ok")
        assert run.status().client == "fz-http"
    listings_read()


@FUZZ
@given(
    name=st.one_of(st.from_regex(r"fz[a-z0-9]{1,8}", fullmatch=True), TEXT),
    options=_options(SCHEDULE_OPTIONS),
)
def test_python_add_schedule_saves_or_raises_one_dtask_error(
    api: tuple[str, str, str], name: str, options: dict[str, Any]
) -> None:
    options.setdefault("every", 60)
    before = counts()
    try:
        dtask.add_schedule(name, "print_range", {"n": 1}, replace=True, **options)
    except DtaskError as exc:
        tally("python add_schedule", "refused" if counts()[1] == before[1] else "created")
        _one_line(str(exc))
        assert counts()[1] == before[1], (name, options, exc)
    except Exception:
        tally("python add_schedule", "traceback")
        raise
    else:
        tally("python add_schedule", "ok")
        if not name.startswith("fz"):
            dtask.remove_schedule(name)
    listings_read()


class Raw(str):
    """JSON text to put in a body as it is."""


def _raw(value: Any) -> str:
    return str(value) if isinstance(value, Raw) else json.dumps(_json_safe(value))


def _json_safe(value: Any) -> Any:
    """What the body can carry as JSON: a moment as ISO text, a float JSON can't hold as text."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


HTTP_OPTIONS = {k: v for k, v in SUBMIT_OPTIONS.items() if k not in ("countdown", "eta", "queue")}


@FUZZ
@given(
    n=st.one_of(N, DEEP.map(lambda depth: Raw("[" * depth + "]" * depth))),
    options=_options(HTTP_OPTIONS),
    junk=st.dictionaries(TEXT, JSON, max_size=2),
)
def test_http_submit_answers_a_run_or_one_json_error(
    api: tuple[str, str, str], n: Any, options: dict[str, Any], junk: dict[str, Any]
) -> None:
    base, client_token, _ = api
    body = _json_safe({"template": "print_range", "variables": {"n": 0}, **options, **junk})
    try:
        text_ = json.dumps(body).replace('{"n": 0}', '{"n": ' + _raw(n) + "}", 1)
    except ValueError:  # an integer over 4,300 digits: json.dumps cannot make the body
        return
    before = counts()
    reply = call_raw(base, "/runs", client_token, text_)
    tally("http POST /runs", "http500" if reply.status >= 500 else "ok" if reply.status < 400 else
          "refused" if counts()[0] == before[0] else "created")  # fmt: skip
    assert reply.status in (200, 201, 400, 404, 409, 413, 422, 429), (body, reply)
    if reply.status >= 400:
        assert isinstance(reply.body, dict), reply
        _one_line(reply.body["error"])
        assert counts()[0] == before[0], (body, reply)
    assert call(base, "GET", "/runs?limit=5", client_token).status == 200
    listings_read()


@FUZZ
@given(name=st.from_regex(r"fz[a-z0-9]{1,8}", fullmatch=True), options=_options(SCHEDULE_OPTIONS))
def test_http_schedule_put_answers_a_schedule_or_one_json_error(
    api: tuple[str, str, str], name: str, options: dict[str, Any]
) -> None:
    base, _, admin = api
    options.setdefault("every", 60)
    body = _json_safe({"template": "print_range", "variables": {"n": 1}, **options})
    before = counts()
    reply = call(base, "PUT", f"/schedules/{name}", admin, body)
    tally("http PUT /schedules", "http500" if reply.status >= 500 else "ok" if reply.status < 400
          else "refused" if counts()[1] == before[1] else "created")  # fmt: skip
    assert reply.status in (200, 201, 400, 404, 409, 422), (body, reply)
    if reply.status >= 400:
        _one_line(reply.body["error"])
        assert counts()[1] == before[1], (body, reply)
    assert call(base, "GET", "/schedules", admin).status == 200
    listings_read()


CLI_FLAGS = {
    "--notify-url": url(["http", "https", "HTTP", ""]),
    "--delay-tolerance": NUMBER,
    "--execution-cap": NUMBER,
    "--priority": NUMBER,
    "--key": TEXT,
    "--after": NUMBER,
}


@FUZZ
@given(n=N, flags=st.lists(st.sampled_from(sorted(CLI_FLAGS)).flatmap(
    lambda flag: st.tuples(st.just(flag), CLI_FLAGS[flag])), max_size=3))  # fmt: skip
def test_cli_submit_exits_0_or_2_in_one_line(
    api: tuple[str, str, str], n: Any, flags: list[tuple[str, Any]]
) -> None:
    try:
        argv = ["submit", "print_range", "-e", f"n={n}", "--client", "fz-http"]
        argv += [f"{flag}={value}" for flag, value in flags]
    except (ValueError, RecursionError):  # str() of an integer over 4,300 digits: no argv
        return
    before = counts()
    try:
        code, err = cli(*argv)
    except Exception:
        tally("cli submit", "traceback")
        raise
    tally("cli submit", "ok" if code == 0 else "refused" if counts()[0] == before[0] else "created")
    assert code in (0, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("dtask: error: ") and err.count("\n") == 1, (argv, err)
        assert counts()[0] == before[0], (argv, err)
    assert cli("runs", "--limit", "3")[0] == 0
    listings_read()
