from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Callable
from pathlib import Path

import platformdirs
import pydantic
import pytest
from celery import Celery
from hypothesis import assume, given
from hypothesis import strategies as st

from dtask.cli import main
from dtask.exceptions import ConfigurationError
from dtask.settings import Settings, env_name, load, mask, table
from dtask.worker import sentinels

Env = Callable[..., None]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Env:
    """Only the DTASK_* variables a test sets."""
    for name in [n for n in os.environ if n.upper().startswith("DTASK_")]:
        monkeypatch.delenv(name)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_defaults_use_embedded_services(env: Env) -> None:
    s = load()
    assert s.embedded_database and s.embedded_broker and s.embedded_result_backend
    assert s.home == platformdirs.user_state_path("dtask")  # the same from any folder
    assert s.templates == ()
    assert (s.max_children, s.lease_ttl, s.heartbeat_interval) == (100_000, 8.0, 2.0)
    assert (s.reaper_interval, s.stall_timeout, s.drain_grace) == (1.0, 15.0, 5.0)
    assert (s.checkpoint_interval, s.checkpoint_every, s.retry_delay) == (1.0, 10_000, 1.0)
    assert s.flower_auth is None


def test_values_are_typed_and_empty_ones_count_as_unset(env: Env, tmp_path: Path) -> None:
    env(
        DTASK_HOME=str(tmp_path / "h"),
        DTASK_TEMPLATES=" a.b, c ,,",
        DTASK_MAX_CHILDREN="",
        DTASK_DATABASE_URL="",
        DTASK_RETRY_DELAY="0.2",
    )
    s = load()
    assert s.home == tmp_path / "h" and s.templates == ("a.b", "c")
    assert s.max_children == 100_000 and s.embedded_database and s.retry_delay == 0.2
    with pytest.raises(pydantic.ValidationError):
        s.lease_ttl = 1  # type: ignore[misc]


def test_result_backend_defaults_to_a_redis_broker_else_the_embedded_redis(env: Env) -> None:
    env(DTASK_BROKER_URL="redis://h:6379/1")
    assert load().result_backend == "redis://h:6379/1"
    env(DTASK_BROKER_URL="amqp://guest:guest@h//")
    amqp = load()
    assert amqp.embedded_result_backend and not amqp.embedded_broker


def test_a_sentinel_broker_needs_its_master_s_name_and_gives_it_to_celery(env: Env) -> None:
    from dtask.worker.config import celery_settings

    url = "sentinel://h1:26379/0;sentinel://h2:26380/0;sentinel://h3:26381/0"
    env(DTASK_BROKER_URL=url, DTASK_DATABASE_URL="postgresql://u@h/db")
    with pytest.raises(ConfigurationError, match=r"^DTASK_BROKER_URL is a sentinel:// URL: set"):
        load()
    env(DTASK_SENTINEL_MASTER="mymaster")
    config = load()
    assert config.result_backend == url  # a Redis broker's, as for redis://
    celery = celery_settings(config)
    for options in ("broker_transport_options", "result_backend_transport_options"):
        assert celery[options]["master_name"] == "mymaster"
        assert celery[options]["sentinel_kwargs"]["socket_timeout"] == config.network_timeout
    assert celery["broker_transport"] == "dtask.worker.sentinels:Transport"
    assert celery["result_backend"] == f"dtask.worker.sentinels:Backend+{url}"
    app = Celery("probe", set_as_current=False)
    app.conf.update(celery)
    assert type(app.backend) is sentinels.Backend
    assert app.connection_for_write().transport_cls == "dtask.worker.sentinels:Transport"
    env(DTASK_BROKER_URL="sentinel://h1:26379;sentinel://h2:99999")
    with pytest.raises(ConfigurationError, match="has a bad port '99999'"):
        load()


def test_heartbeat_defaults_to_a_quarter_of_the_lease(env: Env) -> None:
    env(DTASK_LEASE_TTL="6")
    assert load().heartbeat_interval == 1.5


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"DTASK_MAX_CHILDREN": "lots"}, "DTASK_MAX_CHILDREN='lots' must be a valid integer"),
        ({"DTASK_MAX_CHILDREN": "0"}, "DTASK_MAX_CHILDREN='0' must be >= 1"),
        ({"DTASK_LEASE_TTL": "0.5"}, "DTASK_LEASE_TTL='0.5' must be >= 1"),
        ({"DTASK_LEASE_TTL": "nan"}, "DTASK_LEASE_TTL='nan' must be a finite number"),
        ({"DTASK_REAPER_INTERVAL": "fast"}, "DTASK_REAPER_INTERVAL='fast' must be a number"),
        ({"DTASK_STALL_TIMEOUT": "0"}, "DTASK_STALL_TIMEOUT='0' must be >= 1"),
        ({"DTASK_DRAIN_GRACE": "-1"}, "DTASK_DRAIN_GRACE='-1' must be >= 0"),
        ({"DTASK_CHECKPOINT_INTERVAL": "-1"}, "DTASK_CHECKPOINT_INTERVAL='-1' must be >= 0"),
        ({"DTASK_CHECKPOINT_EVERY": "1.5"}, "DTASK_CHECKPOINT_EVERY='1.5' must be a valid int"),
        ({"DTASK_RETRY_DELAY": "soon"}, "DTASK_RETRY_DELAY='soon' must be a number"),
        ({"DTASK_HEARTBEAT_INTERVAL": "0"}, "DTASK_HEARTBEAT_INTERVAL='0' must be >= 0.1"),
        (
            {"DTASK_LEASE_TTL": "4", "DTASK_HEARTBEAT_INTERVAL": "2"},
            "DTASK_HEARTBEAT_INTERVAL='2' must be under half of DTASK_LEASE_TTL (4)",
        ),
        (
            {"DTASK_RESULT_BACKEND": "redis"},
            "DTASK_RESULT_BACKEND='redis' must be a URL, e.g. redis://host:6379/1",
        ),
        ({"DTASK_FLOWER_AUTH": "admin"}, "DTASK_FLOWER_AUTH must be user:password"),
        ({"DTASK_FLOWER_AUTH": "user:"}, "DTASK_FLOWER_AUTH must be user:password (both non"),
        ({"DTASK_FLOWER_AUTH": ":"}, "DTASK_FLOWER_AUTH must be user:password (both non"),
        ({"DTASK_FLOWER_AUTH": "a:b,c"}, "DTASK_FLOWER_AUTH must be one user:password without"),
        ({"DTASK_REAPER_INTERVAL": "inf"}, "DTASK_REAPER_INTERVAL='inf' must be a finite number"),
        (
            {"DTASK_DATABASE_URL": "mysql://u@h/d"},
            "DTASK_DATABASE_URL='mysql://u@h/d' must be a PostgreSQL URL",
        ),
        ({"DTASK_DATABASE_URL": "::::"}, "DTASK_DATABASE_URL='::::' must be a URL, e.g. postgr"),
        (
            {"DTASK_DATABASE_URL": "postgresql://u@h:99999/d"},
            "DTASK_DATABASE_URL='postgresql://u@h:99999/d' has a bad port '99999' (1 to 65535)",
        ),
        ({"DTASK_BROKER_URL": "redis://h:0/1"}, "DTASK_BROKER_URL='redis://h:0/1' has a bad port"),
        ({"DTASK_TEMPLATES": ".rel"}, "DTASK_TEMPLATES='.rel' names '.rel', which is neither a"),
        ({"DTASK_TEMPLATES": "a/b.py"}, "DTASK_TEMPLATES='a/b.py' names 'a/b.py', which is"),
        (
            {"DTASK_SPLIT_TIMEOUT": "90"},
            "DTASK_SPLIT_TIMEOUT (90) must be below DTASK_DB_IDLE_IN_TRANSACTION_TIMEOUT (60)",
        ),
        ({"DTASK_MAX_VARIABLES": "1"}, "DTASK_MAX_VARIABLES='1' must be >= 2"),
        (
            {"DTASK_LEASE_TT": "5"},
            "DTASK_LEASE_TT is not a dtask setting (did you mean DTASK_LEASE_TTL?)",
        ),
        (
            {"DTASK_TEMPLATE": "x"},
            "DTASK_TEMPLATE is not a dtask setting (did you mean DTASK_TEMPLATES?)",
        ),
    ],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_the_variable(
    env: Env, values: dict[str, str], message: str
) -> None:
    env(**values)
    with pytest.raises(ConfigurationError) as caught:
        load()
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None  # no pydantic trace


def test_every_bad_setting_is_named_in_the_one_line(env: Env) -> None:
    env(DTASK_MAX_CHILDREN="lots", DTASK_LEASE_TTL="0.5", DTASK_LEASE_TT="5")
    with pytest.raises(ConfigurationError) as caught:
        load()
    assert str(caught.value) == (
        "DTASK_MAX_CHILDREN='lots' must be a valid integer; DTASK_LEASE_TTL='0.5' must be >= 1;"
        " DTASK_LEASE_TT is not a dtask setting (did you mean DTASK_LEASE_TTL?)"
    )


def test_other_dtask_names_are_left_for_templates(env: Env) -> None:
    env(DTASK_TEST_SINK="/tmp/sink", DTASK_BENCH_SINK="/tmp/b", DTASK_MY_TEMPLATE_TOKEN="x")
    assert load().max_children == 100_000


def test_errors_never_show_a_secret(env: Env) -> None:
    env(
        DTASK_RESULT_BACKEND="amqp//u:p@ss:w/rd@h//",  # no "://": refused, never shown
        DTASK_FLOWER_AUTH="s3cret-without-user",
        DTASK_DATABASE_ULR="postgresql://u:hunter2@h/db",
    )
    with pytest.raises(ConfigurationError) as caught:
        load()
    text = str(caught.value)
    assert "DTASK_RESULT_BACKEND='amqp//u:***@h//'" in text
    assert "DTASK_FLOWER_AUTH must be" in text and "DTASK_DATABASE_ULR is not" in text
    for secret in ("p@ss", "ss:w", "w/rd", "s3cret", "hunter2"):
        assert secret not in text


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql+psycopg://u:p@:s/s@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u:a?b#c%40@h/db", "postgresql://u:***@h/db"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://:p@w@h:6379/0", "redis://:***@h:6379/0"),
        ("amqp://guest:guest@h//", "amqp://guest:***@h//"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
        ("postgresql://u@h/db?sslpassword=a@b&x=1", "postgresql://u@h/db?sslpassword=***&x=1"),
        ("postgresql://u:pw@h/db?options=a@b", "postgresql://u:***@b"),  # over-masks
        ("u:pw@h/db", "u:***@h/db"),
        ("redis://u:@h/0", "redis://u:@h/0"),
        ("redis+socket:///tmp/r.sock", "redis+socket:///tmp/r.sock"),
        (
            "sentinel://:pw@h1:26379/0;sentinel://:p;w@h2:26379/0",
            "sentinel://:***@h1:26379/0;sentinel://:***@h2:26379/0",
        ),
        (
            "postgresql+psycopg://postgres@/postgres?host=/x",
            "postgresql+psycopg://postgres@/postgres?host=/x",
        ),
    ],
)
def test_mask_hides_passwords(url: str, masked: str) -> None:
    assert mask(url) == masked


@given(st.text(alphabet=string.printable + "@:/?#%", min_size=3))
def test_mask_never_shows_a_password(password: str) -> None:
    masked = mask(f"postgresql+psycopg://user:{password}@host:5432/db")
    assert masked == "postgresql+psycopg://user:***@host:5432/db"
    assume(password not in masked)  # "ost" is in "host", masked or not
    assert password not in masked


SECRET_URL = "postgresql+psycopg://dtask:p%40ss%3Aw%2Frd@db.internal:5432/dtask"


def test_dtask_config_prints_every_setting_with_its_source(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env(
        DTASK_HOME=str(tmp_path),
        DTASK_DATABASE_URL=SECRET_URL,
        DTASK_BROKER_URL="redis://:r3dis@redis:6379/0",
        DTASK_LEASE_TTL="6",
        DTASK_FLOWER_AUTH="admin:fl@w:er/pw",
    )
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: re.split(r"\s{2,}", line) for line in out.splitlines()}
    assert set(lines) == {env_name(f) for f in Settings.model_fields}
    assert lines["DTASK_HOME"] == ["DTASK_HOME", str(tmp_path), "(env)"]
    assert lines["DTASK_DATABASE_URL"][1:] == [
        "postgresql+psycopg://dtask:***@db.internal:5432/dtask",
        "(env)",
    ]
    assert lines["DTASK_RESULT_BACKEND"][1:] == ["redis://:***@redis:6379/0", "(derived)"]
    assert lines["DTASK_HEARTBEAT_INTERVAL"][1:] == ["1.5", "(derived)"]
    assert lines["DTASK_MAX_CHILDREN"][1:] == ["100000", "(default)"]
    assert lines["DTASK_TEMPLATES"][1:] == ["(none)", "(default)"]
    assert lines["DTASK_FLOWER_AUTH"][1:] == ["admin:***", "(env)"]
    for secret in ("p%40ss", "w%2Frd", "r3dis", "fl@w", "er/pw"):
        assert secret not in out


def test_dtask_config_json_is_one_object(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env(DTASK_DATABASE_URL=SECRET_URL, DTASK_TEMPLATES="a,b", DTASK_FLOWER_AUTH="admin:p@:/w")
    assert main(["config", "--json"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["DTASK_DATABASE_URL"] == {
        "value": "postgresql+psycopg://dtask:***@db.internal:5432/dtask",
        "source": "env",
    }
    assert shown["DTASK_BROKER_URL"] == {"value": None, "source": "default"}
    assert shown["DTASK_RESULT_BACKEND"] == {"value": None, "source": "derived"}
    assert shown["DTASK_TEMPLATES"] == {"value": ["a", "b"], "source": "env"}
    assert shown["DTASK_LEASE_TTL"] == {"value": 8.0, "source": "default"}
    assert shown["DTASK_HEARTBEAT_INTERVAL"] == {"value": 2.0, "source": "derived"}
    assert shown["DTASK_FLOWER_AUTH"] == {"value": "admin:***", "source": "env"}
    assert "p@ss" not in out and "p@:/w" not in out


def test_dtask_config_with_a_bad_setting_exits_2_with_one_line(
    env: Env, capsys: pytest.CaptureFixture[str]
) -> None:
    env(DTASK_MAX_CHILDREN="lots")
    assert main(["config"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "dtask: error: DTASK_MAX_CHILDREN='lots' must be a valid integer\n"


def test_flower_needs_a_password_beyond_loopback(env: Env, tmp_path: Path) -> None:
    from dtask.local.stack import flower_auth

    env(DTASK_HOME=str(tmp_path))
    generated = flower_auth("127.0.0.1")  # on loopback: one made for it, kept in the state folder
    assert generated.startswith("dtask:") and flower_auth("127.0.0.1") == generated
    with pytest.raises(ConfigurationError, match="without a password"):
        flower_auth("0.0.0.0")
    env(DTASK_FLOWER_AUTH="admin:p@ss:w/rd")
    assert flower_auth("0.0.0.0") == "admin:p@ss:w/rd"


def test_the_readme_s_settings_table_is_the_one_the_fields_make() -> None:
    """Each setting's meaning is its field's description and its default the field's: the
    README's table is rendered from them (paste ``dtask.settings.table()`` when one changes)."""
    assert all(field.description for field in Settings.model_fields.values())
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table() in readme, f"README.md's configuration table should be:\n{table()}"


@pytest.mark.parametrize(
    ("urls", "mixed"),
    [
        ({}, None),
        ({"DTASK_DATABASE_URL": "postgresql://d", "DTASK_BROKER_URL": "redis://r"}, None),
        (
            {"DTASK_DATABASE_URL": "postgresql://d", "DTASK_BROKER_URL": "amqp://a"},
            "DTASK_DATABASE_URL and DTASK_BROKER_URL are set but DTASK_RESULT_BACKEND is not",
        ),
        (
            {"DTASK_DATABASE_URL": "postgresql://d"},
            "DTASK_DATABASE_URL is set but DTASK_BROKER_URL and DTASK_RESULT_BACKEND are not",
        ),
        (
            {"DTASK_BROKER_URL": "redis://r"},
            "DTASK_BROKER_URL and DTASK_RESULT_BACKEND are set but DTASK_DATABASE_URL is not",
        ),
        (
            {"DTASK_RESULT_BACKEND": "redis://r"},
            "DTASK_RESULT_BACKEND is set but DTASK_DATABASE_URL and DTASK_BROKER_URL are not",
        ),
    ],
)
def test_shared_and_embedded_services_do_not_mix(
    env: Env, urls: dict[str, str], mixed: str | None
) -> None:
    env(**urls)
    problem = load().mixed_services()
    if mixed is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith(mixed)
        assert "set all three" in problem


SETTING_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["inf", "-inf", "nan", "1e400", "-1", "0", "1e-9", "99999999999999999999"]),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.integers().map(str),
    st.from_regex(r"[a-z+]{1,8}://[^/]{0,12}(:[0-9]{0,7})?/?.{0,6}", fullmatch=True),
)


@given(
    st.dictionaries(
        st.sampled_from(sorted(env_name(f) for f in Settings.model_fields)),
        SETTING_TEXT,
        max_size=4,
    )
)
def test_any_settings_load_or_fail_in_one_line(values: dict[str, str]) -> None:
    """Whatever the environment holds: Settings, or one ConfigurationError line; never
    another exception, never a non-finite number or an impossible port accepted."""
    assume(all("\x00" not in v for v in values.values()))  # no environment holds a NUL
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("DTASK_")]:
            del os.environ[name]
        os.environ.update(values)
        try:
            settings = load()
        except ConfigurationError as exc:
            assert "\n" not in str(exc) and str(exc)
            return
        for value in settings.model_dump().values():
            if isinstance(value, float):
                assert value == value and value not in (float("inf"), float("-inf"))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_settings_come_from_secret_files_where_no_variable_is_set(
    env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "dtask_database_url").write_text("postgresql+psycopg://app:pw@db:5432/dtask\n")
    (tmp_path / "dtask_broker_url").write_text("redis://:pw@redis:6379/0")
    env(DTASK_SECRETS_DIR=str(tmp_path))
    settings = load()
    assert settings.database_url == "postgresql+psycopg://app:pw@db:5432/dtask"
    assert settings.broker_url == settings.result_backend == "redis://:pw@redis:6379/0"
    assert main(["config"]) == 0
    shown = capsys.readouterr().out
    assert "app:***@db:5432/dtask  (file)" in shown and "pw@" not in shown
    env(DTASK_BROKER_URL="redis://other:6379/0")  # a variable wins over a file
    assert load().broker_url == "redis://other:6379/0"
