"""deploy/compose.replicated.yml (no Docker engine here): parse it, check it against the code,
and load the settings its secrets give dtask's services (deploy/make-secrets.sh, run here).
The PostgreSQL scripts it mounts run for real in tests/acceptance/test_deploy_replication.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dtask.cli import commands
from dtask.settings import is_sentinel, load

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "deploy" / "compose.replicated.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DTASK = {n: s for n, s in SERVICES.items() if s.get("image") == "dtask:latest"}
SERVERS = {n: s for n, s in SERVICES.items() if n not in DTASK}
SENTINELS = [f"redis-sentinel-{i}" for i in (1, 2, 3)]


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """deploy/make-secrets.sh run in a copy of the repository's deploy/ folder."""
    root = tmp_path_factory.mktemp("deploy")
    shutil.copytree(REPO / "deploy", root / "deploy")
    done = subprocess.run(["sh", "deploy/make-secrets.sh"], cwd=root, capture_output=True)
    assert done.returncode == 0, done.stderr
    yield root / "secrets"


def test_it_runs_the_replicated_set_up_the_docs_describe() -> None:
    assert set(DTASK) == {"migrate", "worker", "beat", "api", "flower"}
    assert set(SERVERS) == {
        "postgres-primary", "postgres-replica", "redis-primary", "redis-replica", *SENTINELS
    }  # fmt: skip
    assert SERVICES["beat"]["deploy"]["replicas"] == 2
    assert SERVICES["api"]["deploy"]["replicas"] == 2
    assert "ports" not in SERVICES["worker"], "workers scale: no fixed host ports"
    known = commands()
    for name, service in DTASK.items():
        assert service["command"][0] in known, name
        assert service["build"] == "..", name  # the repository's Dockerfile


def test_every_service_has_a_healthcheck_and_dtask_waits_for_the_servers() -> None:
    for name, service in SERVICES.items():
        if name not in ("migrate", "beat"):
            assert "healthcheck" in service, name
    waits = SERVICES["worker"]["depends_on"]
    assert waits["migrate"]["condition"] == "service_completed_successfully"
    for server in ("postgres-primary", *SENTINELS):
        assert waits[server]["condition"] == "service_healthy", server


def test_the_servers_are_on_an_internal_network_and_only_api_and_flower_are_published() -> None:
    assert COMPOSE["networks"]["servers"]["internal"] is True
    for name, service in SERVICES.items():
        if name in ("api", "flower"):
            assert set(service["networks"]) == {"servers", "published"}
            for port in service["ports"]:
                assert port.startswith("${DTASK_PUBLISH_ADDRESS:-127.0.0.1}:"), (name, port)
        else:
            assert service["networks"] == ["servers"], name
            assert "ports" not in service, f"{name} publishes a port"


def test_no_secret_is_an_environment_variable_or_a_command_line_argument() -> None:
    words = ("PASSWORD", "AUTH", "DATABASE_URL", "BROKER_URL", "SECRET")
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE"):
                assert str(value).startswith("/run/secrets/"), (name, key)
            else:
                assert not any(w in key for w in words), f"{name} sets {key}"
        assert "pass" not in " ".join(map(str, service.get("command") or [])).lower(), name
    for secret in COMPOSE["secrets"].values():
        assert secret["file"].startswith("../secrets/")


def test_only_migrate_owns_the_tables(secrets: Path) -> None:
    for name, service in DTASK.items():
        url = next(s["source"] for s in service["secrets"] if s["target"] == "dtask_database_url")
        owner = "replicated_owner_database_url"
        assert url == (owner if name == "migrate" else "replicated_app_database_url"), name
    assert (
        (secrets / "replicated_owner_database_url")
        .read_text()
        .startswith("postgresql+psycopg://dtask_owner:")
    )


def test_every_secret_the_file_names_is_made_by_make_secrets(secrets: Path) -> None:
    for secret in COMPOSE["secrets"].values():
        assert (secrets.parent / secret["file"].removeprefix("../")).is_file(), secret
    assert oct((secrets).stat().st_mode)[-3:] == "700"


def test_dtask_s_services_load_settings_that_fail_over(
    secrets: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What a worker container sees under /run/secrets/, loaded as dtask loads it."""
    for name in [n for n in os.environ if n.upper().startswith("DTASK_")]:
        monkeypatch.delenv(name)
    mounted = tmp_path / "run-secrets"
    mounted.mkdir()
    for given in SERVICES["worker"]["secrets"]:
        shutil.copy(secrets / COMPOSE["secrets"][given["source"]]["file"].split("/")[-1],
                    mounted / given["target"])  # fmt: skip
    monkeypatch.setenv("DTASK_SECRETS_DIR", str(mounted))
    for key, value in SERVICES["worker"]["environment"].items():
        monkeypatch.setenv(key, re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value)))
    settings = load()
    assert settings.database_url is not None
    assert "host=postgres-primary:5432&host=postgres-replica:5432" in settings.database_url
    assert settings.database_url.endswith("target_session_attrs=read-write")
    assert is_sentinel(settings.broker_url)
    assert [u.split("@")[1] for u in settings.broker_url.split(";")] == [
        f"{s}:26379/0" for s in SENTINELS
    ]
    monitor = re.search(r"^sentinel monitor (\S+) redis-primary 6379 2$",
                        (secrets / "sentinel.conf").read_text(), re.M)  # fmt: skip
    assert monitor and settings.sentinel_master == monitor.group(1)


def test_the_redis_servers_share_one_password_and_the_broker_url_carries_it(
    secrets: Path,
) -> None:
    password = re.findall(r"sentinel://:([^@]+)@", (secrets / "replicated_broker_url").read_text())
    assert len(set(password)) == 1 and len(password) == 3
    for conf in ("redis_primary.conf", "redis_replica.conf"):
        text = (secrets / conf).read_text()
        assert f"requirepass {password[0]}\n" in text and f"masterauth {password[0]}\n" in text
    assert f"sentinel auth-pass dtask {password[0]}\n" in (secrets / "sentinel.conf").read_text()
    assert "replicaof redis-primary 6379" in (secrets / "redis_replica.conf").read_text()
