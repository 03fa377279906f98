"""Issue 58, items 9 and 10 at their causes: numbers past any float or PostgreSQL bigint, and
URLs of odd shapes, are one DtaskError line where they enter (a parameter, a schedule's
interval, a client's rate, a notify_url, a DTASK_*_URL setting), never a ValueError or an
OverflowError later. The property tests hold each checker against the library that reads what
it passes: what dtask accepts, SQLAlchemy, kombu and urllib read without raising."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from datetime import date
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kombu.utils.url import url_to_parts
from psycopg import pq
from psycopg.conninfo import make_conninfo
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.engine import make_url

from dtask.cli import bulk
from dtask.domain.clients import Client, Rate, check_priority
from dtask.domain.notify import check_url
from dtask.domain.params import Param
from dtask.domain.schedules import make_timing
from dtask.domain.templates import registry
from dtask.domain.urls import LIBPQ_KEYWORDS, failover
from dtask.exceptions import (
    ConfigurationError,
    DtaskError,
    InvalidClient,
    InvalidNotifyUrl,
    InvalidSchedule,
    InvalidVariables,
    TemplateDefinitionError,
)
from dtask.settings import load
from dtask.templating import command_templates
from tests.support.shapes import (
    NUMBER_TEXT,
    TOML_KEY,
    examples,
    tally,
    toml_file,
    toml_value,
    url,
)

HUGE = 10**400


def _id(value: object) -> str:  # pytest's own str() refuses an integer past 4,300 digits
    try:
        return repr(value)[:30]
    except ValueError:
        return type(value).__name__


@pytest.mark.parametrize(
    ("param", "value", "says"),
    [
        (Param(float), HUGE, "variable 'x' must be a finite number, got an integer of 401 digits"),
        (Param(float), -HUGE, "must be a finite number, got an integer of 401 digits"),
        (Param(int), 2**63, "variable 'x' must be an int from -9,223,372,036,854,775,808 to"),
        (Param(int), -(2**63) - 1, "must be an int from"),
        (Param(int, max=50), 10**5000, "got an integer of 5,001 digits"),
        (Param(str), 10**5000, "variable 'x' must be str, got int an integer of 5,001 digits"),
        (Param(str), [10**5000], "must be str, got list a list too large to show"),
        (Param(date), 10**5000, "must be an ISO 8601 date like 2026-03-01, got an integer"),
        (Param(float, min=0.0), float("nan"), "must be a finite number, got nan"),
    ],
    ids=_id,
)
def test_a_number_past_its_type_is_one_line_naming_the_variable(
    param: Param, value: object, says: str
) -> None:
    with pytest.raises(InvalidVariables) as caught:
        param.check("x", value)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_the_bounds_of_an_int_are_a_bigint_s() -> None:
    assert Param(int).check("x", 2**63 - 1) == 2**63 - 1
    assert Param(int).check("x", -(2**63)) == -(2**63)
    assert Param(float).check("x", 2**1000) == float(2**1000)


@pytest.mark.parametrize(
    ("param", "says"),
    [
        (lambda: Param(int, default=HUGE), "an int's default must be an int from"),
        (lambda: Param(float, default=float("inf")), "a float's default must be a finite number"),
        (lambda: Param(int, max=5, default=9), "an int's default must be <= 5, got 9"),
        (lambda: Param(int, min="a", default=5), "cannot be compared with its bounds 'a'"),
    ],
)
def test_a_default_past_its_parameter_s_type_is_a_template_s_error(
    param: Callable[[], Param], says: str
) -> None:
    with pytest.raises(TemplateDefinitionError, match=says):
        param()


SOUND_TOML = (
    '[template.t]\nparams = { n = "int" }\nskeleton = { a = 1, b = "${n}" }\n'
    'split = { range = ["a", "b"], chunk = 1 }\ncommand = ["echo", "${a}"]\n'
)


@pytest.mark.parametrize(
    "text",
    [
        SOUND_TOML.replace('"int"', '{ type = "int", default = ' + "9" * 4301 + " }"),
        SOUND_TOML + "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
        SOUND_TOML + "grace = 1" + "0" * 400 + "\n",
        SOUND_TOML + "grace = -1\n",
        SOUND_TOML + "grace = nan\n",
    ],
    ids=["int-4301-digits", "deep-arrays", "grace-past-float", "grace-negative", "grace-nan"],
)
def test_a_toml_file_of_numbers_past_its_reader_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "jobs.toml"
    path.write_text(text)
    with pytest.raises(DtaskError) as raised:
        command_templates.load(path)
    assert str(raised.value).startswith(f"{path}: ") and "\n" not in str(raised.value)


@pytest.mark.parametrize("text", ["1e400", "-1e400", "inf", "nan", "9" * 400])
def test_command_line_text_past_any_float_names_the_text(text: str) -> None:
    with pytest.raises(InvalidVariables, match=f"'x' must be a finite number, got '{text[:20]}"):
        Param(float).parse("x", text)


@pytest.mark.parametrize(
    "every", [10**80, 10**400, float("inf"), float("nan"), "60", True, 0], ids=_id
)
def test_a_schedule_s_interval_past_its_bound_is_one_line(every: object) -> None:
    with pytest.raises(InvalidSchedule, match="an interval must be 1 to 31622400 seconds, got"):
        make_timing(every=every, grace=10.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("grace", [HUGE, float("inf"), "10", [1]], ids=_id)
def test_a_schedule_s_grace_past_its_bound_is_one_line(grace: object) -> None:
    with pytest.raises(InvalidSchedule, match="the misfire grace must be 2 to 86400 seconds"):
        make_timing(every=60, grace=grace)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rate", ["9" * 4301 + "/m", "9" * 11 + "/m", "\u0665/m", "0/m", 5, None, "5/w"], ids=_id
)  # fmt: skip
def test_a_rate_past_its_bound_is_one_line(rate: object) -> None:
    with pytest.raises(InvalidClient, match="rate must look like N/PERIOD with N from 1 to"):
        Rate.parse(rate)  # type: ignore[arg-type]


def test_a_client_s_numbers_past_any_bound_are_one_line() -> None:
    for made in (
        lambda: Client("c", max_running=10**5000),
        lambda: Client("c", weight=10**5000),
        lambda: check_priority(10**5000),
    ):
        with pytest.raises(InvalidClient, match="got an integer of 5,001 digits"):
            made()


@pytest.mark.parametrize(
    "notify",
    [
        "http://[::1", "http://::1]/", "http://[zz]/", "http://h:99999/", "http://h:0/",
        "http://h:x/", "http://h:-1/", "http://h/a b", "http://h/\n", "http://h\x00/", 5,
    ],
)  # fmt: skip
def test_a_notify_url_of_a_bad_shape_is_one_line(notify: object) -> None:
    with pytest.raises(InvalidNotifyUrl, match="notify_url must be an http"):
        check_url(notify)  # type: ignore[arg-type]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    for name in [n for n in os.environ if n.upper().startswith("DTASK_")]:
        monkeypatch.delenv(name)
    yield lambda **values: [monkeypatch.setenv(k, v) for k, v in values.items()]


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DTASK_DATABASE_URL", "postgresql+psycopg://u:p@[::1/x", "has a bad host: an IPv6"),
        ("DTASK_DATABASE_URL", "postgresql://u:p@h1:5432,h2:5432/x", "has a bad port '5432,h2"),
        ("DTASK_DATABASE_URL", "postgresql://u:p@[::1]x/db", "has a bad host"),
        ("DTASK_DATABASE_URL", "postgresql://u:p@ss:w/rd@h/db", "percent-encode a password"),
        ("DTASK_BROKER_URL", "redis://[::1:6379/0", "has a bad host: an IPv6"),
        ("DTASK_BROKER_URL", "redis://h:6379:7/0", "has a bad port '6379:7'"),
        ("DTASK_BROKER_URL", "redis://:pa#ss@h:6379/0", "percent-encode a password"),
        ("DTASK_RESULT_BACKEND", "db+postgresql://u:p@[::1/x", "has a bad host: an IPv6"),
    ],
)
def test_a_setting_s_url_of_a_bad_shape_is_one_line(
    env: Callable[..., None], variable: str, value: str, says: str
) -> None:
    env(**{variable: value}, DTASK_SENTINEL_MASTER="m")
    with pytest.raises(ConfigurationError) as caught:
        load()
    said = str(caught.value)
    assert said.startswith(f"{variable}=") and says in said and "\n" not in said
    assert "pa#ss" not in said and ":w" not in said.replace(":***", "")


def test_the_libpq_keywords_dtask_admits_are_the_installed_libpq_s() -> None:
    installed = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
    assert installed == LIBPQ_KEYWORDS, installed ^ LIBPQ_KEYWORDS


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("y=1", "has 'y' in its query, which is no libpq connection keyword"),
        ("host=a:1&port=5", "mixes host=HOST:PORT and port="),
        ("host=a,b&port=1,2,3", "names as many ports as hosts"),
        ("port=1,x", "has a bad port 'x' in its query"),
        ("host=a:b:c&host=d", "has a bad host=HOST:PORT"),
    ],
)
def test_a_database_url_s_query_of_a_bad_shape_is_one_line(
    env: Callable[..., None], query: str, says: str
) -> None:
    env(DTASK_DATABASE_URL=f"postgresql://u@h/db?{query}")
    with pytest.raises(ConfigurationError, match=says):
        load()


def test_an_alert_webhook_of_a_bad_shape_is_one_line_without_its_secret(
    env: Callable[..., None],
) -> None:
    env(DTASK_ALERT_WEBHOOK="https://hooks.example.com:99999/T0/s3cret")
    with pytest.raises(ConfigurationError) as caught:
        load()
    said = str(caught.value)
    assert said.startswith("DTASK_ALERT_WEBHOOK must be an http(s) URL") and "s3cret" not in said


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(database=url(), broker=url(), backend=url())
@example(  # found by hypothesis: a ';' inside a backend URL's user and password
    database="postgresql://127.0.0.1",
    broker="postgresql://127.0.0.1:1",
    backend="db+postgresql://[::1;1abc://u@127.0.0.1",
)
@example(  # found by hypothesis: a '?' in the password, the query after the host unchecked
    database="postgresql://127.0.0.1:1/db?sslmode=require;postgresql://u@127.0.0.1/0?x=1",
    broker="rediss://u@127.0.0.1",
    backend="db+postgresql://127.0.0.1",
)
def test_a_url_a_setting_takes_is_one_its_reader_reads(
    env: Callable[..., None], database: str, broker: str, backend: str
) -> None:
    for variable, value in (
        ("DTASK_DATABASE_URL", database),
        ("DTASK_BROKER_URL", broker),
        ("DTASK_RESULT_BACKEND", backend),
    ):
        env(DTASK_DATABASE_URL="", DTASK_BROKER_URL="", DTASK_RESULT_BACKEND="")
        value = value.replace("\x00", "")  # an environment cannot hold it
        env(**{variable: value}, DTASK_SENTINEL_MASTER="m")
        try:
            load()
        except ConfigurationError as exc:
            tally("settings (readers)", "refused")
            assert "\n" not in str(exc) and str(exc).startswith(variable), exc
            continue
        except Exception:
            tally("settings (readers)", "traceback")
            raise
        tally("settings (readers)", "ok")
        # kombu splits a broker's failover list at each ';', the backend is split where a
        # scheme follows (a ';' in its password stays there), the database URL never
        parts = {"DTASK_BROKER_URL": value.split(";"), "DTASK_RESULT_BACKEND": failover(value)}
        for one in parts.get(variable, [value]):
            if "://" not in one:
                continue  # a Sentinel list's parts, kombu's failover ones after the first
            scheme = one.partition("://")[0].lower()
            sqlalchemy = "db+" if variable == "DTASK_RESULT_BACKEND" else "postgresql"
            if variable != "DTASK_BROKER_URL" and scheme.startswith(sqlalchemy):
                read = make_url(one[3:] if scheme.startswith("db+") else one)
                assert read.port is None or 1 <= read.port <= 65535
                if variable == "DTASK_DATABASE_URL":  # all a connect does before the network
                    args, kwargs = psycopg_dialect().create_connect_args(read)
                    make_conninfo(*args, **kwargs)
            elif scheme.split("+")[0] in ("redis", "rediss", "amqp", "pyamqp", "sentinel"):
                url_to_parts(one)
                assert urlsplit(one).port != 0


@settings(max_examples=examples(200))
@given(notify=url(["http", "https", "HTTP", "ftp"]))
def test_a_notify_url_dtask_takes_is_one_its_delivery_reads(notify: str) -> None:
    try:
        check_url(notify, allow_private=False)
    except InvalidNotifyUrl as exc:
        tally("notify_url (readers)", "refused")
        assert "\n" not in str(exc)
        return
    except Exception:
        tally("notify_url (readers)", "traceback")
        raise
    tally("notify_url (readers)", "ok")
    parts = urlsplit(notify)
    assert parts.hostname and parts.port != 0 and (parts.port or 80) <= 65535


@settings(max_examples=examples(100))
@given(text=NUMBER_TEXT, kind=st.sampled_from([int, float]))
def test_number_text_for_a_parameter_is_a_value_or_one_line(text: str, kind: type) -> None:
    try:
        value = Param(kind).check("x", Param(kind).parse("x", text))
    except InvalidVariables as exc:
        tally("parameter text", "refused")
        assert "\n" not in str(exc)
    except Exception:
        tally("parameter text", "traceback")
        raise
    else:
        tally("parameter text", "ok")
        assert isinstance(value, kind)


BASE = {
    "params": {"n": "int"},
    "skeleton": {"a": 1, "b": "${n}"},
    "split": {"range": ["a", "b"], "chunk": 1},
    "command": ["echo", "${a}"],
}


NUMBERS = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**63, -(2**63) - 1]),
)
# a parameter's table: where a number past a float or a bigint is read (its default)
PARAM = st.one_of(
    st.sampled_from(["int", "float", "str", "bool", "date", "list", ""]),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["int", "float", "str", "bool", "nope"])},
        optional={"default": st.one_of(NUMBERS, st.just(10**400), toml_value(0)),
                  "min": NUMBERS, "max": NUMBERS, "x": toml_value(0)},
    ),
    toml_value(1),
)  # fmt: skip


@settings(max_examples=examples(100))
@given(
    name=st.one_of(st.just("fzt"), st.just("fzt"), TOML_KEY),
    params=st.one_of(st.just(BASE["params"]), st.dictionaries(TOML_KEY, PARAM, max_size=3)),
    drop=st.one_of(st.just(set()), st.sets(st.sampled_from(sorted(BASE)))),
    extra=st.one_of(st.just({}), st.dictionaries(
        st.one_of(TOML_KEY, st.sampled_from(sorted(command_templates.KEYS))),
        st.one_of(NUMBERS, toml_value()), max_size=3)),
    nested=st.one_of(st.just({}), st.dictionaries(st.sampled_from(sorted(BASE)), toml_value(),
                                                  max_size=2)),
)  # fmt: skip
def test_a_toml_template_of_any_shape_loads_or_is_one_line(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    params: dict[str, object],
    drop: set[str],
    extra: dict[str, object],
    nested: dict[str, object],
) -> None:
    given = {**BASE, "params": params, **nested, **extra}
    table = {k: v for k, v in given.items() if k not in drop}
    path = tmp_path_factory.mktemp("toml") / "jobs.toml"
    path.write_text(toml_file(name, table))
    try:
        made = command_templates.load(Path(path))
    except DtaskError:  # TemplateDefinitionError, or a template's own check (the CLI prints
        tally("toml templates", "refused")  # it as one line: a key's newline escaped)
    except Exception:
        tally("toml templates", "traceback")
        raise
    else:
        tally("toml templates", "ok")
        for template in made:
            registry.discard(template.name)


def test_a_from_file_s_lines_of_any_shape_are_runs_or_their_one_line_errors() -> None:
    lines = [
        b'{"n": 1}\n',
        b"x" * 3_000_000 + b"\n",  # over the bound: skipped in pieces, never held whole
        b"\xff\xfe\n",
        b"[" * 100_000 + b"\n",
        b"\n",
        b'{"variables": {"n": 2}, "key": 5}\n',
        b'{"variables": {"n": 3}, "key": "k"}',
    ]
    numbers: list[int] = []
    items = list(bulk._items(io.BytesIO(b"".join(lines)), {"d": 0}, numbers, most=200_000))
    assert numbers == [1, 2, 3, 4, 6, 7]
    assert items[0] == ({"d": 0, "n": 1}, None)
    said = [str(v) if isinstance(v, DtaskError) else None for v, _ in items]
    assert said[1:5] == [
        "the line is over 200,000 bytes (DTASK_MAX_VARIABLES)",
        "not UTF-8 text (byte 1)",
        "not JSON this deep (nested past Python's recursion)",
        "its key must be a string",
    ]
    assert items[5] == ({"d": 0, "n": 3}, "k")
