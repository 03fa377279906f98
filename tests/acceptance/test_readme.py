"""The README is tested: every ``sh`` and ``python`` block runs as written, in order, from a
folder outside the checkout, on the embedded default (tests/support/readme.py says how a block
is marked as a file to write, or skipped with its reason)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.support.readme import blocks

pytestmark = pytest.mark.acceptance
README = REPO / "README.md"
END = "DTASK_README_EOF"


def test_every_block_is_run_written_or_skipped_with_a_reason() -> None:
    found = [b for b in blocks(README) if b.language in ("sh", "python")]
    assert len([b for b in found if b.runs]) >= 5
    for block in found:
        assert block.runs or block.file or (block.skip and len(block.skip) > 10), block.line


def test_the_readmes_blocks_run_as_written(tmp_path: Path) -> None:
    folder, home = tmp_path / "project", tmp_path / "home"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    env.pop("PYTHONPATH", None)  # nothing of the checkout but the installed dtask
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}", DTASK_HOME=str(home))
    state = folder / ".readme-state.sh"
    state.write_text("")
    try:
        for block in blocks(README):
            if block.file:
                (folder / block.file).write_text(block.code)
            elif block.runs:
                code = _on_the_api_port_up_chose(block.code, tmp_path)
                _run(block.language, code, block.line, folder, env, state, tmp_path)
    finally:
        _stop_everything_of(home, env)


def _on_the_api_port_up_chose(code: str, logs: Path) -> str:
    """The README's blocks name `dtask up`'s default API port, 8000, as a user's would; where
    8000 was taken (another test's stack or `make demo` on this machine), `dtask up` said
    which free port it took instead, and the blocks run against that one."""
    for log in logs.glob("readme-line-*.log"):
        found = API_LINE.search(log.read_text(errors="replace"))
        if found:
            return code.replace("127.0.0.1:8000/", f"127.0.0.1:{found[1]}/")
    return code


API_LINE = re.compile(r"^ *api +http://127\.0\.0\.1:(\d+)/api/v1$", re.M)


def _run(
    language: str, code: str, line: int, folder: Path, env: dict[str, str], state: Path,
    logs: Path,
) -> None:  # fmt: skip
    if language == "sh":
        script = f"source {state}\nset -eo pipefail\n{code}export -p > {state}\n"
    else:
        script = f"source {state}\npython - <<'{END}'\n{code}{END}\n"
    log = logs / f"readme-line-{line}.log"
    with log.open("wb") as out:  # a file, not a pipe: `dtask up &` outlives the block
        result = subprocess.run(  # a session of its own: `dtask up &` is in its group, not ours
            ["bash", "-c", script], cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT,
            timeout=600, start_new_session=True,
        )  # fmt: skip
    text = log.read_text(errors="replace")
    print(f"\n--- README line {line} ({language}): exit {result.returncode}\n{text[-1500:]}")
    assert result.returncode == 0, f"README.md line {line} failed:\n{text[-3000:]}"
    assert "Traceback" not in text, f"README.md line {line}:\n{text[-3000:]}"


def _stop_everything_of(home: Path, env: dict[str, str]) -> None:
    """`dtask up` and what it started for this home, then the embedded services."""
    ours = os.getpgrp()
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("DTASK_HOME") != str(home) or "up" not in proc.cmdline():
                continue
            group = os.getpgid(proc.pid)
            if group != ours:  # never the test run's own group (make, pytest)
                os.killpg(group, signal.SIGTERM)
                proc.wait(60)
        except (psutil.Error, ProcessLookupError):
            continue
    subprocess.run(["dtask", "down", "--force"], env=env, capture_output=True, timeout=120)
