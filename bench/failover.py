"""Failover under SIGKILL with default settings: kill the whole worker running a child, time
until the child runs again elsewhere, and count the items it printed twice.

    .venv/bin/python -m bench.failover [--kills 12]

Prints a Markdown table (also written to bench/out/failover.md).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per printed item")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dtask-failover-"))
    (work / "sink").mkdir()
    for name in [n for n in os.environ if n.startswith("DTASK_")]:
        del os.environ[name]
    os.environ.update(
        DTASK_HOME=str(work / "home"),
        DTASK_TEMPLATES="bench.templates",
        DTASK_BENCH_SINK=str(work / "sink"),
        PYTHONPATH=str(REPO),
    )
    import dtask
    from dtask import services
    from dtask.services import embedded

    store = services.store()
    settings = services.current().settings
    dtask_bin = str(Path(sys.executable).with_name("dtask"))
    workers: list[subprocess.Popen[bytes]] = []

    def start_worker() -> None:
        log = (work / f"worker-{len(workers)}.log").open("wb")
        proc = subprocess.Popen(
            [dtask_bin, "worker", "-c", "1", "--without-mingle", "--without-gossip"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )  # fmt: skip
        workers.append(proc)

    def child() -> tuple[str | None, str, int, object]:
        with store.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT owner, state, attempt, checkpoint FROM dtask_children"
                    " WHERE run_id = :r AND index = 0"
                ),
                {"r": run.id},
            ).first()
        return (row.owner, row.state, row.attempt, row.checkpoint) if row else (None, "", 0, None)

    rows = []
    rng = random.Random(args.seed)
    try:
        for _ in range(3):
            start_worker()
        time.sleep(8)
        items_per_checkpoint = settings.checkpoint_interval / args.delay
        for kill in range(1, args.kills + 1):
            run = dtask.submit("bench_slow", {"items": 2000, "delay": args.delay})
            while True:
                owner, state, attempt, checkpoint = child()
                if state == "running" and isinstance(checkpoint, dict) and checkpoint["done"] > 100:
                    break
                time.sleep(0.02)
            assert owner is not None
            time.sleep(rng.uniform(0, 1.5))  # anywhere between checkpoints and heartbeats
            pid = int(owner.rsplit(":", 1)[1])
            group = os.getpgid(pid)
            os.killpg(group, signal.SIGKILL)
            killed = time.monotonic()
            while True:
                _, state, attempt2, _ = child()
                if state == "running" and attempt2 > attempt:
                    break
                time.sleep(0.02)
            resumed = time.monotonic() - killed
            for proc in workers:
                if proc.pid == group:
                    proc.wait(10)
            start_worker()  # keep three workers alive
            status = run.wait(timeout=120)
            assert status.state is dtask.RunState.SUCCEEDED, status.error
            seen = (work / "sink" / f"{run.id}.txt").read_text().split()
            assert set(seen) == {str(i) for i in range(1, 2001)}
            rows.append((kill, resumed, len(seen) - len(set(seen))))
            print(f"kill {kill}: resumed after {resumed:.2f} s, {rows[-1][2]} items re-printed",
                  flush=True)  # fmt: skip
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        embedded.stop(Path(os.environ["DTASK_HOME"]))

    times = [r[1] for r in rows]
    again = [r[2] for r in rows]
    lines = [
        f"Settings: DTASK_LEASE_TTL={settings.lease_ttl:g}, heartbeat every"
        f" {settings.heartbeat_interval:g} s, reaper every {settings.reaper_interval:g} s,"
        f" checkpoint every {settings.checkpoint_interval:g} s (= {items_per_checkpoint:.0f}"
        f" items at {args.delay:g} s/item); 3 workers x 1 process; whole worker SIGKILLed"
        " at a random moment 0-1.5 s after a checkpoint.",
        "",
        "| kill | kill -> child running elsewhere (s) | items printed twice |",
        "|---:|---:|---:|",
        *[f"| {k} | {t:.2f} | {n} |" for k, t, n in rows],
        f"| **median** | **{statistics.median(times):.2f}** | **{statistics.median(again):g}** |",
        f"| **max** | **{max(times):.2f}** | **{max(again)}** |",
    ]
    table = "\n".join(lines)
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "failover.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
