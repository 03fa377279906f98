from __future__ import annotations

from pathlib import Path

import pytest

from dtask.exceptions import ConfigurationError
from dtask.settings import DOCUMENTED, load, mask


def test_defaults_use_embedded_services() -> None:
    s = load({})
    assert s.embedded_database and s.embedded_broker
    assert s.home == Path(".dtask").absolute()
    assert s.max_children == 100_000
    assert s.lease_ttl <= 10


def test_result_backend_defaults_to_a_redis_broker_else_the_embedded_redis() -> None:
    s = load({"DTASK_BROKER_URL": "redis://h:6379/1"})
    assert s.result_backend == "redis://h:6379/1"
    amqp = load({"DTASK_BROKER_URL": "amqp://guest:guest@h//"})
    assert amqp.embedded_result_backend and not amqp.embedded_broker


def test_heartbeat_defaults_to_a_quarter_of_the_lease() -> None:
    s = load({"DTASK_LEASE_TTL": "6"})
    assert s.heartbeat_interval == 1.5


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DTASK_MAX_CHILDREN": "lots"}, "not a number"),
        ({"DTASK_MAX_CHILDREN": "0"}, ">= 1"),
        ({"DTASK_LEASE_TTL": "4", "DTASK_HEARTBEAT_INTERVAL": "2"}, "under half"),
        ({"DTASK_RESULT_BACKEND": "db+sqlite:///x"}, "must be a redis"),
    ],
)
def test_bad_settings_are_one_clear_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load(env)


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis+socket:///tmp/r.sock", "redis+socket:///tmp/r.sock"),
        (
            "postgresql+psycopg://postgres@/postgres?host=/x",
            "postgresql+psycopg://postgres@/postgres?host=/x",
        ),
    ],
)
def test_mask_hides_passwords(url: str, masked: str) -> None:
    assert mask(url) == masked


def test_every_setting_is_documented_in_the_readme() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in DOCUMENTED:
        assert f"`{name}`" in readme, name
