"""CPU a `dtask` command and a worker's start cost: each command run ``--rounds`` times as
``python -m dtask.cli ...`` and timed with ``getrusage`` (its process's CPU, user and system),
and a worker's main process from its start to `` ready.``. ``--trees A,B`` runs the same in
other checkouts of dtask (``git worktree add``), alternating, for a before/after.

    .venv/bin/python -m bench.startup [--rounds 5] [--trees /tmp/before,.]

Each tree's services are an embedded PostgreSQL and Redis under a temporary DTASK_HOME of its
own, started once (not timed); a command that fails has
its exit code beside its figure."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["--version"],  # before 903d182: argparse's "arguments are required", after all imports
    ["--help"],
    ["templates"],  # needs no service: no database driver since it left dtask.services
    ["config"],
    ["status", "1"],
    ["runs", "--limit", "5"],
    ["submit", "tiny", "--var", "n=1", "--var", "fail_every=0"],
]


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def command_cpu(tree: Path, env: dict[str, str], argv: list[str]) -> tuple[float, int]:
    """The command's CPU seconds and exit code (an older tree on a newer tree's database
    failed at once, and looked fast: its figure is marked)."""
    before = _children_cpu()
    done = subprocess.run(
        [sys.executable, "-m", "dtask.cli", *argv],
        cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, check=False,
    )  # fmt: skip
    return _children_cpu() - before, done.returncode


def worker_start_cpu(tree: Path, env: dict[str, str], log: Path) -> float:
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "dtask.cli", "worker", "--without-mingle", "--without-gossip"],
            cwd=tree, env={**env, "PYTHONPATH": str(tree)}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while b" ready." not in log.read_bytes():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.02)
        stat = Path(f"/proc/{worker.pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        worker.terminate()
        worker.wait(60)
    return cpu


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trees", default=".", help="checkouts of dtask, comma-separated")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    base = {k: v for k, v in os.environ.items() if not k.startswith("DTASK_")}
    base["DTASK_TEMPLATES"] = "tests.support.templates"
    # each tree its own home: an older tree refuses a database a newer one migrated
    envs = {
        tree: {**base, "DTASK_HOME": tempfile.mkdtemp(prefix="dtask-startup-")} for tree in trees
    }
    seen: dict[tuple[Path, str], list[float]] = {}
    try:
        for tree, env in envs.items():  # services started and run 1 made, untimed
            if command_cpu(tree, env, COMMANDS[-1])[1]:
                raise SystemExit(f"{tree}: the first submit failed")
        for _ in range(args.rounds):
            for tree, env in envs.items():
                for argv in COMMANDS:
                    cpu, code = command_cpu(tree, env, argv)
                    what = argv[0] if code == 0 else f"{argv[0]} (exit {code})"
                    seen.setdefault((tree, what), []).append(cpu)
                cpu = worker_start_cpu(tree, env, Path(env["DTASK_HOME"]) / "worker.log")
                seen.setdefault((tree, "worker to ready"), []).append(cpu)
    finally:
        for tree, env in envs.items():
            subprocess.run(
                [sys.executable, "-m", "dtask.cli", "down", "--force"],
                cwd=tree, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, check=False,
            )  # fmt: skip
    print(f"CPU seconds, median (min-max) of {args.rounds}:")
    for (tree, what), cpus in seen.items():
        print(
            f"  {tree}  {what:16} {statistics.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
