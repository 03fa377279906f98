"""The import rules of docs/architecture.md: layers, no circles, a pure domain.

The rules are import-linter contracts in pyproject.toml. These tests run them on the code, show
that each one catches the breach it is for, and check at run time that the pure modules load
neither SQLAlchemy nor Celery (a package ``__init__`` can drag them in where the static graph
does not show it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
HEAVY = ("sqlalchemy", "psycopg", "celery", "kombu", "redis", "alembic")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_code_keeps_every_import_rule() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "domain/templates.py",
            "from dtask.client.runs import Run",
            "Layers: each imports only what is below it",
        ),
        ("db/children.py", "from dtask.db import runs", "No import circles, at any depth"),
        ("domain/runs.py", "import sqlalchemy", "The domain is pure"),
        ("client/runs.py", "import sqlalchemy", "All SQL is in dtask.db"),
        ("services/__init__.py", "import celery", "Only dtask.worker talks to Celery"),
    ],
)
def test_each_rule_catches_its_breach(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "dtask", tmp_path / "dtask", ignore=skip)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    if module == "db/children.py":  # a circle needs both directions: runs -> children too
        runs = tmp_path / "dtask/db/runs.py"
        runs.write_text(runs.read_text() + "\nfrom dtask.db import children  # noqa\n")
    target = tmp_path / "dtask" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout
    broken = result.stdout.split("Broken contracts")[1]
    assert contract in broken, result.stdout


def test_pure_modules_load_no_services_library() -> None:
    pure = [
        "dtask",
        "dtask.exceptions",
        "dtask.settings",
        "dtask.progress",
        "dtask.templating",  # `dtask templates` loads no database driver
        "dtask.templating.command_templates",
        *(
            f"dtask.domain.{p.stem}"
            for p in sorted((REPO / "dtask/domain").glob("*.py"))
            if p.stem != "__init__"
        ),
    ]
    probe = (
        "import importlib, sys\n"
        f"for name in {pure!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "[]"


def test_adopting_an_app_loads_none_of_what_only_workers_need() -> None:
    """``dtask.init_app`` in a web process or beat (issue 36): no SQLAlchemy, no driver, no
    pydantic settings, no worker module beyond the app and its task table, until the first
    submit; a worker loads the rest at its celeryd_init (tests/acceptance/test_django_worker)."""
    probe = (
        "import sys\n"
        "from celery import Celery\n"
        "import dtask\n"
        "app = dtask.init_app(Celery('proj', broker='redis://127.0.0.1:1/0'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('sqlalchemy', 'psycopg', 'pydantic', 'pydantic_settings', 'alembic')"
        " or (m.startswith('dtask.') and m.split('.')[1] in ('db', 'services', 'client'))"
        " or m in ('dtask.settings', 'dtask.worker.tasks', 'dtask.worker.received')))\n"
        "print(sorted(n for n in app.tasks if n.startswith('dtask.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    assert out[0] == "[]"
    tasks = ["chains", "child", "children", "finalize", "master", "masters", "pickup", "submit"]
    assert out[1] == repr([f"dtask.{name}" for name in tasks])
