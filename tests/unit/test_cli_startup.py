"""Commands that need no service import no database driver, broker client nor Celery, and
`dtask --version` not even the commands (issue 42: start-up)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

from tests.conftest import DTASK, REPO

CHECK = """
import sys
from dtask.cli import main
code = main(["--version"])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"pydantic_settings", "sqlalchemy",
               "celery", "kombu", "psycopg"} | {m for m in sys.modules if m == "dtask.settings"})
print("imported:", heavy)
sys.exit(code)
"""


def test_version_prints_the_installed_version_without_importing_the_commands() -> None:
    shown = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [f"dtask {version('dtask')}", "imported: []"]


def test_version_is_listed_in_help_and_works_after_other_options() -> None:
    helped = subprocess.run([DTASK, "--help"], capture_output=True, text=True, timeout=60)
    assert "--version" in helped.stdout
    shown = subprocess.run(
        [DTASK, "--templates", "x", "--version"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and shown.stdout == f"dtask {version('dtask')}\n", shown


SERVICE_FREE = """
import contextlib, io, sys
from dtask.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"sqlalchemy", "psycopg", "celery",
               "kombu", "redis"} | {m for m in sys.modules if m == "dtask.services"})
print("imported:", heavy)
sys.exit(code)
"""


@pytest.mark.parametrize(
    "argv", [["templates"], ["templates", "--json"], ["config"], ["submit", "--help"]]
)
def test_a_command_that_needs_no_service_imports_no_driver(argv: list[str]) -> None:
    shown = subprocess.run(
        [sys.executable, "-c", SERVICE_FREE, *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1] == "imported: []"
