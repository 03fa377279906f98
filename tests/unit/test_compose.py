"""docker-compose.yml (no Docker engine here): parse it and check it against the code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dtask.cli import commands

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
DTASK_SERVICES = {
    n: s for n, s in SERVICES.items() if s.get("build") or s.get("image") == "dtask:latest"
}


def test_every_dtask_service_runs_a_real_dtask_command() -> None:
    assert set(DTASK_SERVICES) == {"migrate", "worker", "beat", "flower", "api"}
    known = commands()
    for name, service in DTASK_SERVICES.items():
        assert service["command"][0] in known, name
    entrypoint = (REPO / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dtask"]' in entrypoint
    worker = SERVICES["worker"]
    hostname = worker["command"][worker["command"].index("--hostname") + 1]
    assert hostname.replace("%h", "$${HOSTNAME}") in worker["healthcheck"]["test"][1]


def test_services_wait_for_healthy_dependencies_and_have_healthchecks() -> None:
    for name in ("postgres", "redis", "worker", "flower", "api"):
        assert "healthcheck" in SERVICES[name], name
    worker_deps = SERVICES["worker"]["depends_on"]
    assert worker_deps["migrate"]["condition"] == "service_completed_successfully"
    assert worker_deps["postgres"]["condition"] == "service_healthy"
    assert "ports" not in SERVICES["worker"], "workers scale: no fixed host ports"


def test_flower_is_behind_basic_auth() -> None:
    flower = SERVICES["flower"]
    targets = {s["target"] for s in flower["secrets"]}
    assert "dtask_flower_auth" in targets  # read as the DTASK_FLOWER_AUTH setting
    assert "0.0.0.0" in flower["command"]  # inside the container; published below


def test_http_services_are_published_on_the_host_s_loopback_unless_the_operator_opts_in() -> None:
    for name in ("flower", "api"):
        for port in SERVICES[name]["ports"]:
            assert port.startswith("${DTASK_PUBLISH_ADDRESS:-127.0.0.1}:"), (name, port)
    for name, service in SERVICES.items():
        if name not in ("flower", "api"):
            assert "ports" not in service, f"{name} publishes a port"


def test_no_secret_is_an_environment_variable_or_a_command_line_argument() -> None:
    secret_words = ("PASSWORD", "AUTH", "DATABASE_URL", "BROKER_URL", "SECRET")
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if key.endswith("_FILE"):
                assert str(value).startswith("/run/secrets/"), (name, key)
                continue
            assert not any(w in key for w in secret_words), f"{name} sets {key} in its environment"
        assert not any("pass" in str(arg).lower() for arg in service.get("command") or []), name
    files = {s["file"] for s in COMPOSE["secrets"].values()}
    assert all(f.startswith("./secrets/") for f in files)
    assert "secrets/" in (REPO / ".gitignore").read_text().split()


def test_redis_requires_a_password_and_every_dtask_service_reads_its_urls_from_secrets() -> None:
    redis = SERVICES["redis"]
    assert redis["command"] == ["redis-server", "/run/secrets/redis.conf"]
    script = (REPO / "deploy" / "make-secrets.sh").read_text()
    assert "requirepass %s" in script and "redis://:%s@redis:6379/0" in script
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][1]
    for name, service in DTASK_SERVICES.items():
        targets = {s["target"] for s in service["secrets"]}
        assert {"dtask_database_url", "dtask_broker_url"} <= targets, name


def test_only_migrate_uses_the_tables_owner_every_other_service_the_app_role() -> None:
    postgres = SERVICES["postgres"]
    assert postgres["environment"]["POSTGRES_USER"] == "postgres"
    assert "/docker-entrypoint-initdb.d/" in " ".join(postgres["volumes"])
    for name, service in DTASK_SERVICES.items():
        url = next(s["source"] for s in service["secrets"] if s["target"] == "dtask_database_url")
        assert url == ("owner_database_url" if name == "migrate" else "app_database_url"), name
    script = (REPO / "deploy" / "make-secrets.sh").read_text()
    assert "postgresql+psycopg://dtask_app:%s@postgres" in script
    assert "postgresql+psycopg://dtask_owner:%s@postgres" in script


def test_every_env_var_is_documented() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    readme = (REPO / "README.md").read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z_]+)", text)) | {  # $${X}: the shell's, not ours
        key for s in SERVICES.values() for key in (s.get("environment") or {})
    }
    postgres_image_vars = {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD_FILE"}
    for name in sorted(used - postgres_image_vars):
        assert f"`{name}`" in readme, f"{name} is used by docker-compose.yml but not in README.md"
