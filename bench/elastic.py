"""Straggler stealing measured (docs/elastic.md): four `dtask worker -c 2` (8 slots) on the
embedded PostgreSQL and Redis; a run of four 200-number children whose third is ten times
slower (2 s a child, 20 s the straggler), with ``stealable=False`` and with stealing, three
times each in turn; the same for a command template over a shell script
(tests/support/commands/straggle.sh, ``stealable = true`` in its TOML file). Wall time,
pieces made, numbers done twice, and the slots in use over time (sampled every 0.1 s from
PostgreSQL): bench/out/elastic.json, the table printed, and docs/benchmarks/elastic.png.

    .venv/bin/python -m bench.elastic
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from bench.cluster import REPO, Workers, prepare_environment

N, DELAY, REPEATS = 800, 0.01, 3
SLOW = {"slow_from": 401, "slow_to": 600}
JOBS = REPO / "tests" / "support" / "commands" / "jobs.toml"  # its DELAY and SLOW are ours
PAIRS = {  # without stealing, with it
    "Python": ("straggler_fixed", "straggler"),  # tests/support/templates.py's
    "command": ("straggler_cmd_fixed", "straggler_cmd"),
}


def one(template: str, sink: Path) -> dict[str, object]:
    from sqlalchemy import text

    import dtask
    from dtask import services

    started = time.monotonic()
    delay = {} if template in PAIRS["command"] else {"delay": DELAY}
    run = dtask.submit(template, {"n": N, **delay, **SLOW})
    used: list[tuple[float, int]] = []
    engine = services.store().engine
    while not run.ready():
        with engine.connect() as conn:
            running = conn.execute(
                text("SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'running'"),
                {"r": run.id},
            ).scalar_one()
        used.append((round(time.monotonic() - started, 2), int(running)))
        time.sleep(0.1)
    wall = time.monotonic() - started
    status = run.status()
    assert status.state is dtask.RunState.SUCCEEDED, status.error
    seen = Counter(int(x) for f in sink.glob(f"{run.id}-*.txt") for x in f.read_text().split())
    assert sorted(seen) == list(range(1, N + 1)), "a number was not done"
    return {
        "template": template,
        "wall": round(wall, 2),
        "pieces": status.children.total,
        "twice": sum(c - 1 for c in seen.values()),
        "used": used,
    }


def plot(results: list[dict[str, object]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    for template, label in zip(PAIRS["Python"], ("stealable=False", "stealing"), strict=True):
        first = next(r for r in results if r["template"] == template)
        used = first["used"]
        assert isinstance(used, list)
        ax.step([t for t, _ in used], [n for _, n in used], where="post",
                label=f"{label}: {first['wall']} s, {first['pieces']} children")  # fmt: skip
    ax.axhline(8, color="grey", linestyle=":", label="8 slots")
    ax.set_xlabel("seconds since submit")
    ax.set_ylabel("children running")
    ax.set_title("A 4-child run whose third child is 10x slower, 4 workers x 2 slots")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    work = prepare_environment()
    os.environ["DTASK_TEMPLATES"] += f",tests.support.templates,{JOBS}"
    os.environ["DTASK_TEST_SINK"] = str(work / "sink")  # where the tests' stragglers write
    from dtask import services
    from dtask.client.workers import slots_for
    from dtask.services import embedded

    services.store()  # the embedded services, migrated
    workers = Workers(work)
    results: list[dict[str, object]] = []
    try:
        for _ in range(4):
            workers.dtask(2)
        workers.ready(timeout=120)
        while slots_for("dtask") < 8:
            time.sleep(0.1)
        for _ in range(REPEATS):
            for template in [t for pair in PAIRS.values() for t in pair]:
                results.append(one(template, work / "sink"))
                print(json.dumps({k: v for k, v in results[-1].items() if k != "used"}))
    finally:
        workers.stop_all()
        embedded.stop(work / "home")
    (REPO / "bench" / "out").mkdir(exist_ok=True)
    (REPO / "bench" / "out" / "elastic.json").write_text(json.dumps(results) + "\n")
    plot(results, REPO / "docs" / "benchmarks" / "elastic.png")
    print(f"| | wall (median of {REPEATS}) | children |")
    print("|---|---|---|")
    twice = sum(int(str(r["twice"])) for r in results)
    for kind, (fixed_t, stolen_t) in PAIRS.items():
        fixed, stolen = (
            statistics.median(float(str(r["wall"])) for r in results if r["template"] == t)
            for t in (fixed_t, stolen_t)
        )
        pieces = [r["pieces"] for r in results if r["template"] == stolen_t]
        print(f"| {kind}, not stealable | {fixed:.1f} s | 4 |")
        print(f"| {kind}, stealing | {stolen:.1f} s | {pieces} |")
        print(f"{kind}: stealing finishes {100 * (1 - stolen / fixed):.0f} % sooner")
    print(f"numbers done twice in all {len(results)} runs: {twice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
