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
    assert "DTASK_FLOWER_AUTH" in flower["environment"]
    assert "0.0.0.0" in flower["command"]


def test_the_api_is_published_on_the_host_s_loopback_only() -> None:
    api = SERVICES["api"]
    assert api["command"][:1] == ["serve"]
    assert all(port.startswith("127.0.0.1:") for port in api["ports"])


def test_every_env_var_is_documented() -> None:
    text = (REPO / "docker-compose.yml").read_text()
    readme = (REPO / "README.md").read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z_]+)", text)) | {  # $${X}: the shell's, not ours
        key for s in SERVICES.values() for key in (s.get("environment") or {})
    }
    postgres_image_vars = {"POSTGRES_USER", "POSTGRES_DB"}
    for name in sorted(used - postgres_image_vars):
        assert f"`{name}`" in readme, f"{name} is used by docker-compose.yml but not in README.md"
