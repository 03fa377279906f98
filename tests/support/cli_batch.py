"""Many `dtask` commands in one process: ``python -m tests.support.cli_batch`` reads a JSON
list of argument lists on stdin and runs each as the console script does (``dtask.cli.main``),
writing each one's exit code, stdout, stderr and the number of runs in PostgreSQL after it.

A command's process start costs 0.7-1 s of CPU here, most of it imports; tests of one-line
errors run dozens of commands that fail before they touch a service, and one interpreter for
all of them keeps the suite's time for what needs processes of its own. Each test that uses
it also runs one of its commands as a process of its own, the console script whole."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtask import services
from tests.support.db import run_count

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Outcome:
    code: int
    stdout: str
    stderr: str
    runs: int  # runs in PostgreSQL once the command ended


def run_all(env: dict[str, str], commands: list[list[str]]) -> list[Outcome]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.cli_batch"],
        input=json.dumps(commands), env=env, cwd=REPO, capture_output=True, text=True,
        timeout=60 + 10 * len(commands), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [Outcome(**o) for o in json.loads(done.stdout)]


def _one(argv: list[str]) -> dict[str, Any]:
    from dtask import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: Any = cli.main(argv)
        except SystemExit as exc:  # argparse's --help, as the console script would exit
            code = exc.code
        except Exception:  # uncaught: the console script's traceback and exit code
            traceback.print_exc()
            code = 1
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    commands = json.load(sys.stdin)
    environ = dict(os.environ)
    outcomes = []
    for argv in commands:
        outcome = _one(argv)
        os.environ.clear()
        os.environ.update(environ)  # `--templates` sets DTASK_TEMPLATES for its command only
        services.reset()  # the next command starts from the settings, as a new process would
        outcomes.append({**outcome, "runs": run_count()})
    json.dump(outcomes, sys.stdout)


if __name__ == "__main__":
    main()
