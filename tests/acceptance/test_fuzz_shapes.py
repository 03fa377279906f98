"""The fuzz of tests/acceptance/test_fuzz_surfaces.py on SHAPES, not only values (issue 58):
HTTP bodies of every JSON shape (a run, a batch, a schedule; numbers past any float as JSON
text, keys twice, wrong types, nesting, URLs of odd shapes), sent whole or chunked; command
lines with each option spelled as people spell it and given number and URL shapes; DTASK_*
settings of URL and number shapes. For every call: a result, or one line (exit 2, 3 or 4; a
JSON error with a 4xx status), never a traceback or a 500; a refused call creates nothing.

`make test` runs 25 examples a test; `python -m tests.fuzz --minutes 10` runs this file, the
surfaces' fuzz and tests/unit/test_bad_shapes.py for ten minutes and prints the counts."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtask import services
from dtask.cli import main
from dtask.db.database import sql
from tests.acceptance.test_fuzz_surfaces import api, listings_read
from tests.integration.test_hostile_input import counts
from tests.support.api import Reply
from tests.support.shapes import HUGE_TEXT, NUMBER_TEXT, examples, spelled, tally, url

pytestmark = pytest.mark.acceptance
__all__ = ["api"]  # the surfaces' module fixture: a real `dtask serve` and two tokens

SHAPES = settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Raw(str):
    """JSON text put in a body as it is."""


def text_of(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {text_of(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(text_of(v) for v in value) + "]"
    return json.dumps(value)


JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def mostly(good: st.SearchStrategy[Any], odd: st.SearchStrategy[Any], percent: int = 75) -> Any:
    """``good`` that share of the time, else ``odd``: a fuzz that only meets refusals never
    reaches what is done with an accepted value."""
    return st.integers(0, 99).flatmap(lambda k: good if k < percent else odd)


NUMBER = st.one_of(
    NUMBER_TEXT.filter(JSON_NUMBER.fullmatch).map(Raw),
    st.sampled_from([Raw(t) for t in [*HUGE_TEXT, "NaN", "Infinity", "-0", "1E2", "0.0"]]),
    st.sampled_from(["5", True, None, [], {}, 5, 0, -1, 2**63, 1, 9, 60, 0.5]),
)
NOTIFY = url(["http", "https", "HTTP", "ftp", ""])
ANY = st.one_of(NUMBER, st.text(max_size=12), NOTIFY, st.lists(NUMBER, max_size=2))
VARIABLES = mostly(
    st.one_of(st.just({"n": 3}), st.fixed_dictionaries({"n": st.integers(-5, 3000)})),
    st.one_of(
        st.fixed_dictionaries({"n": NUMBER}),
        st.dictionaries(st.sampled_from(["n", "m", "", "n "]), ANY, max_size=3),
        ANY,
    ),
)
# each option: a sound value half the time (so that odd shapes also meet accepted neighbours)
SOUND = {
    "priority": 5, "delay_tolerance": 60, "execution_cap": 60, "after": [], "after_keys": [],
    "notify_url": "http://127.0.0.1:9/hook", "max_concurrent": 2, "concurrency_key": "k",
    "on_late": "run", "tier": "basic", "key": "fz-key", "client": "fz-http", "nope": 1,
}  # fmt: skip
OPTION = {
    "priority": NUMBER, "delay_tolerance": NUMBER, "execution_cap": NUMBER, "notify_url": NOTIFY,
    "after": st.lists(NUMBER, max_size=2), "after_keys": st.lists(ANY, max_size=2),
    "max_concurrent": NUMBER, "concurrency_key": ANY, "on_late": ANY, "tier": ANY,
    "key": st.one_of(st.text(min_size=1, max_size=20), ANY),
    "client": st.sampled_from(["fz-http", "other", "", 5]), "nope": ANY,
}  # fmt: skip
OPTION = {k: mostly(st.just(SOUND[k]), v, 50) for k, v in OPTION.items()}
ITEM = mostly(
    st.fixed_dictionaries({"variables": VARIABLES}, optional={"key": ANY, "extra": ANY}), ANY
)
TEMPLATE = mostly(st.just("print_range"), ANY, 85)


MOMENT = st.one_of(st.sampled_from(["2026-12-01T09:00", "2026-12-01T09:00:00+14:00"]), ANY)
SCHEDULE = {
    "cron": st.one_of(st.just("0 3 * * *"), ANY), "every": NUMBER, "tz": ANY, "misfire": ANY,
    "overlap": ANY, "grace": NUMBER, "catch_up_window": NUMBER, "start": MOMENT, "end": MOMENT,
    "delay_tolerance": NUMBER, "on_late": ANY, "after_schedule": ANY, "nope": ANY,
}  # fmt: skip
CALM = {
    "cron": "0 3 * * *", "every": 60, "tz": "UTC", "misfire": "skip", "overlap": "allow",
    "grace": 10, "catch_up_window": 3600, "start": "2026-12-01T09:00:00+00:00",
    "end": "2030-01-01T00:00:00+00:00", "delay_tolerance": 60, "on_late": "run",
    "after_schedule": None, "nope": 1,
}  # fmt: skip
SCHEDULE = {k: mostly(st.just(CALM[k]), v, 50) for k, v in SCHEDULE.items()}


@st.composite
def request(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """The body of a run, a batch or a schedule: mostly sound, with up to two options of any
    shape."""
    body = {"template": draw(TEMPLATE)}
    if draw(st.integers(0, 4)) == 0:  # a float parameter; n=0 keeps it from ever running
        body["template"], variables = (
            "slow_range",
            st.fixed_dictionaries({"n": st.just(0), "delay": NUMBER}),
        )
        body["variables" if path != "/runs/batch" else "runs"] = draw(
            variables if path != "/runs/batch"
            else st.lists(st.fixed_dictionaries({"variables": variables}), max_size=3)
        )  # fmt: skip
    elif path == "/runs/batch":
        body["runs"] = draw(mostly(st.lists(ITEM, max_size=4), ANY, 85))
    else:
        body["variables"] = draw(VARIABLES)
    options = SCHEDULE if path.startswith("/schedules") else OPTION
    if path.startswith("/schedules"):
        body["every"] = 60
    for key in draw(st.lists(st.sampled_from(sorted(options)), max_size=2, unique=True)):
        body[key] = draw(options[key])
    if "cron" in body:
        body.pop("every")
    return body


PATHS = ["/runs", "/runs/batch", "/schedules/fzshape"]
ODD = st.one_of(
    ANY.map(text_of),
    st.sampled_from(
        ["", "{", "{}", "null", '{"template": "print_range", "template": 5}', "[" * 5000,
         '{"template": "print_range", "variables": {"n": 3}} x', '{"a": "\\ud800"}',
         '{"template": "print_range", "variables": {"n": 3, "n": ' + HUGE_TEXT[2] + "}}"]
    ),
)  # fmt: skip
CALL = st.sampled_from(PATHS).flatmap(
    lambda path: st.tuples(st.just(path), mostly(request(path).map(text_of), ODD, 85))
)


def send(base: str, method: str, path: str, token: str, body: bytes, chunks: int) -> Reply:
    """``body`` sent as it is; in ``chunks`` pieces with Transfer-Encoding: chunked (0: with
    Content-Length). An answer that is no JSON is kept as its text."""
    where = urlsplit(base)
    conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    try:
        if chunks:
            size = max(1, len(body) // chunks)
            pieces = [body[i : i + size] for i in range(0, len(body), size)]
            headers["Transfer-Encoding"] = "chunked"
            conn.request(method, where.path + path, iter(pieces), headers, encode_chunked=True)
        else:
            conn.request(method, where.path + path, body, headers)
        answer = conn.getresponse()
        raw = answer.read()
    finally:
        conn.close()
    try:
        shown = json.loads(raw) if raw else None
    except ValueError:
        shown = raw.decode(errors="replace")
    return Reply(answer.status, dict(answer.getheaders()), shown)


@SHAPES
@given(call=CALL, chunks=st.sampled_from([0, 0, 1, 3]))
def test_http_bodies_of_any_shape_answer_a_result_or_one_json_error(
    api: tuple[str, str, str], call: tuple[str, str], chunks: int
) -> None:
    base, client_token, admin = api
    path, body = call
    before = counts()
    schedule = path.startswith("/schedules")
    method, token = ("PUT", admin) if schedule else ("POST", client_token)
    surface = f"http {method} {path.replace('/fzshape', '')} (shapes)"
    try:
        reply = send(base, method, path, token, body.encode("utf-8", "surrogatepass"), chunks)
    except (http.client.RemoteDisconnected, ConnectionError):  # a 413 may close first
        tally(surface, "refused")
        assert counts() == before
        return
    if reply.status >= 500:
        tally(surface, "http500")
    assert reply.status < 500, (path, body[:300], reply)
    if reply.status >= 400:
        tally(surface, "refused")
        assert isinstance(reply.body, dict) and "\n" not in reply.body["error"], reply
        if counts() != before:
            tally(surface, "created")
        assert counts() == before, (path, body[:300], reply)
    else:
        tally(surface, "ok")
        if path == "/runs/batch":
            made = sum(r["outcome"] == "created" for r in reply.body["runs"])
            assert counts()[0] == before[0] + made, reply
    listings_read()


def cli(argv: list[str]) -> tuple[int, str]:
    """`dtask ARGV` in this process: its exit code and stderr; a traceback fails the test."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own exits
            code = int(exc.code or 0)
        except Exception:
            tally("cli (shapes)", "traceback")
            raise
    return code, err.getvalue()


TEXT = st.one_of(NUMBER_TEXT, st.text(max_size=8), url(["http", "https", "HTTP", ""]))
RATE = st.one_of(NUMBER_TEXT.map(lambda n: f"{n}/m"), st.sampled_from(["5 / h", "1/w", "/m"]))
NOTIFY_TEXT = url(["http", "https", "HTTP", "ftp", ""])
# each command's options: (a sound value, the shapes it is given half the time)
COMMANDS: dict[str, tuple[list[str], dict[str, tuple[str, Any]]]] = {
    "submit": (["submit", "print_range", "-e", "n=3", "--client", "fz-http"], {
        "--notify-url": ("http://127.0.0.1:9/hook", NOTIFY_TEXT), "--priority": ("5", TEXT),
        "--execution-cap": ("60", TEXT), "--delay-tolerance": ("60", TEXT),
        "--after": ("1", TEXT), "--after-key": ("fz-key", TEXT), "--max-concurrent": ("2", TEXT),
        "--key": ("fz-key", TEXT), "-e": ("n=5", TEXT.map(lambda t: f"n={t}")),
        "--on-late": ("fail", TEXT), "--tier": ("regular", TEXT),
        "--concurrency-key": ("k", TEXT),
    }),
    "schedule": (["schedule", "add", "fzshape", "print_range", "-e", "n=1", "--replace"], {
        "--every": ("60", TEXT), "--cron": ("0 3 * * *", TEXT), "--grace": ("10", TEXT),
        "--catch-up-window": ("3600", TEXT), "--start": ("2026-12-01T09:00", TEXT),
        "--end": ("2030-01-01T00:00", TEXT), "--tz": ("Pacific/Kiritimati", TEXT),
        "--delay-tolerance": ("60", TEXT),
    }),
    "client": (["client", "set", "fzshape"], {
        "--rate": ("5/m", RATE), "--child-rate": ("100/s", RATE), "--max-running": ("4", TEXT),
        "--weight": ("2", TEXT), "--max-priority": ("7", TEXT), "--tier": ("regular", TEXT),
    }),
    "reads": (["runs"], {
        "--limit": ("5", TEXT), "--state": ("running", TEXT), "--client": ("fz-http", TEXT),
    }),
}  # fmt: skip


@st.composite
def command_line(draw: st.DrawFn) -> list[str]:
    base, options = COMMANDS[draw(st.sampled_from(sorted(COMMANDS)))]
    argv = list(base)
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=2))
    if base[0] == "schedule" and not {"--every", "--cron"} & set(chosen):
        argv += ["--every", "60"]
    for option in chosen:
        sound, shapes = options[option]
        argv += draw(spelled(option, draw(mostly(st.just(sound), shapes, 50))))
    if base[0] == "runs" and draw(st.booleans()):  # a run id of any shape
        shown = draw(mostly(st.just("1"), TEXT, 50))
        argv = [draw(st.sampled_from(["status", "children", "graph"])), shown]
    return argv


@SHAPES
@given(argv=command_line())
def test_cli_options_of_any_spelling_and_shape_exit_in_one_line(
    api: tuple[str, str, str], argv: list[str]
) -> None:
    before = counts()
    code, err = cli(argv)
    surface = f"cli {argv[0]} (shapes)"
    assert "Traceback" not in err, (argv, err)
    if code == 0:
        tally(surface, "ok")
        return
    tally(surface, "refused")
    assert code in (2, 3, 4), (argv, code, err)
    last = err.splitlines()[-1] if err else ""
    assert last.startswith("dtask: error: ") and err.count("dtask: error: ") == 1, (argv, err)
    if counts() != before:
        tally(surface, "created")
    assert counts() == before, (argv, err)


SETTINGS = {  # a sound value, the shapes it is given half the time
    "DTASK_DATABASE_URL": ("postgresql://u:p@127.0.0.1:1/db", url(["postgresql", "POSTGRESQL"])),
    "DTASK_BROKER_URL": ("redis://127.0.0.1:1/0", url()),
    "DTASK_RESULT_BACKEND": ("redis://127.0.0.1:1/1", url()),
    "DTASK_ALERT_WEBHOOK": ("http://127.0.0.1:9/alerts", url(["http", "https", ""])),
    "DTASK_MAX_VARIABLES": ("1048576", NUMBER_TEXT),
    "DTASK_LEASE_TTL": ("30", NUMBER_TEXT),
    "DTASK_MAX_CHILDREN": ("1000", NUMBER_TEXT),
    "DTASK_NETWORK_TIMEOUT": ("5", NUMBER_TEXT),
    "DTASK_TEMPLATES": ("tests.support.templates", st.text(max_size=12)),
}
SETTING = {name: mostly(st.just(sound), odd, 50) for name, (sound, odd) in SETTINGS.items()}


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    services.reset()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        services.reset()


@SHAPES
@given(
    values=st.lists(st.sampled_from(sorted(SETTING)), max_size=2, unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: SETTING[n] for n in names})
    ),
    command=st.sampled_from([["config"], ["runs", "--limit", "1"], ["workers"]]),
)
def test_settings_of_any_shape_run_or_exit_in_one_line(
    api: tuple[str, str, str], values: dict[str, str], command: list[str]
) -> None:
    values = {k: v.replace("\x00", "") for k, v in values.items()}  # no environment holds it
    before = counts()
    with environment(values):
        code, err = cli(command)
    surface = "settings (shapes)"
    assert "Traceback" not in err, (values, err)
    if code == 0:
        tally(surface, "ok")
    else:
        tally(surface, "refused")
        assert code == 2 and err.startswith("dtask: error: ") and err.count("\n") == 1, (
            values,
            err,
        )
    assert counts() == before


@pytest.fixture(scope="module", autouse=True)
def made_nothing_else(api: tuple[str, str, str]) -> Iterator[None]:
    yield
    with services.store().runs.db.tx() as conn:  # what the fuzz saved, so others start clean
        conn.execute(sql("DELETE FROM dtask_schedules WHERE name LIKE 'fz%'"))
        conn.execute(sql("DELETE FROM dtask_clients WHERE name LIKE 'fzshape%'"))
