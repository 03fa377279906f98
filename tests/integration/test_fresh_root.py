"""A fresh machine, as root: the first starts of the embedded PostgreSQL run at once (make
test's parallel processes, two DTASK_HOMEs) before pgserver's system user exists. Each
``useradd`` raced the others, and a data directory chowned to a uid the user did not end up
with failed its ``initdb`` (433 errors in a suite on a fresh machine, 2026-11-28)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _mount_namespaces() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(not _mount_namespaces(), reason="needs root and mount namespaces")
def test_first_starts_at_once_on_a_machine_without_pgserver_s_user_all_start(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private",
         sys.executable, "-m", "tests.support.fresh_root", str(tmp_path), "3"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == ["ok", "ok", "ok"]
