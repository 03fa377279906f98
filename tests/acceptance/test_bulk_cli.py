"""`dtask submit TEMPLATE --from FILE.jsonl` with real workers: every line's run is created and
runs; the same file again creates nothing (each line's key is known); a file with bad lines
creates nothing, names each bad line, and exits 2."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from dtask import services
from tests.conftest import DTASK, REPO, running_workers
from tests.support.db import wait_for

pytestmark = pytest.mark.acceptance

N = 100


def states(ids: list[int]) -> dict[str, int]:
    with services.store().engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state, count(*) FROM dtask_runs WHERE id = ANY(:ids) GROUP BY 1"),
            {"ids": ids},
        ).all()
    return {str(s): int(n) for s, n in rows}


def dtask_submit(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DTASK, "submit", "tagged", *args], env=env, cwd=REPO, input=stdin,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_file_of_runs_is_submitted_once_and_runs(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    stamp = tmp_path.name
    lines = tmp_path / "runs.jsonl"
    lines.write_text(
        "".join(
            json.dumps({"variables": {"n": 1 + i % 3}, "key": f"{stamp}-{i}"}) + "\n"
            for i in range(N)
        )
    )
    with running_workers(dtask_env, tmp_path, 1, "-c", "2"):
        started = time.monotonic()
        done = dtask_submit(dtask_env, "--from", str(lines), "--var", "delay=0", "--json")
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
        assert [r["outcome"] for r in found] == ["created"] * N
        assert [r["line"] for r in found] == list(range(1, N + 1))
        assert f"{N} runs: {N} created" in done.stderr
        ids = [r["run_id"] for r in found]
        print(f"\nsubmitted in {time.monotonic() - started:.1f} s")
        wait_for(lambda: states(ids) == {"succeeded": N}, 180, f"the {N} runs to succeed")
        print(f"succeeded after {time.monotonic() - started:.1f} s")

        again = dtask_submit(dtask_env, "--from", str(lines), "--var", "delay=0")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == f"{N} runs: {N} known key"

        bad = "\n".join(
            [
                '{"n": 1, "delay": 0}',
                "not json",
                "",
                '{"n": "x", "delay": 0}',
                '{"n": 2, "delay": 0}',
            ]
        )
        mixed = dtask_submit(dtask_env, "--from", "-", stdin=bad)
        assert mixed.returncode == 2
        assert mixed.stdout == ""  # checked whole first: nothing submitted
        assert mixed.stderr.splitlines() == [
            "line 2: invalid: not JSON: Expecting value: line 1 column 1 (char 0)",
            "line 4: invalid: variable 'n' must be int, got str 'x'",
            "dtask: error: 2 of 4 lines are no runs: nothing was submitted; fix them and"
            " submit the file again",
        ]
