"""Dependencies at scale: a fan-in of N upstream runs to one dependent, and a chain of M runs,
on two dtask workers (2 processes each). Checks that every run succeeded once and measures
the time from the last upstream's finalize to the dependent's first child.

    .venv/bin/python -m bench.deps [--fan-in 1000] [--chain 200]

Prints a Markdown table (also written to bench/out/deps.md).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.cluster import REPO, Workers, prepare_environment


def _latencies(engine: Any, pairs: list[tuple[int, list[int]]]) -> list[float]:
    """For each (dependent, its upstreams): seconds from the last upstream's finish to the
    dependent's first child's start."""
    out = []
    with engine.connect() as conn:
        for run_id, ups in pairs:
            row = conn.execute(
                text(
                    "SELECT (SELECT min(started_at) FROM dtask_children WHERE run_id = :id)"
                    " - (SELECT max(finished_at) FROM dtask_runs WHERE id = ANY(:ups)) AS gap"
                ),
                {"id": run_id, "ups": ups},
            ).one()
            out.append(row.gap.total_seconds())
    return out


def _check(engine: Any, ids: list[int]) -> None:
    with engine.connect() as conn:
        bad = conn.execute(
            text(
                "SELECT id, state, dispatches FROM dtask_runs WHERE id = ANY(:ids)"
                " AND (state <> 'succeeded' OR dispatches <> 1)"
            ),
            {"ids": ids},
        ).all()
    if bad:
        raise SystemExit(f"runs not succeeded exactly once: {bad[:5]}")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fan-in", type=int, default=1000)
    parser.add_argument("--chain", type=int, default=200)
    args = parser.parse_args()
    work = prepare_environment()
    import dtask
    from dtask import services

    store = services.store()
    workers = Workers(work)
    rows = []
    try:
        workers.ready(workers.dtask(2), workers.dtask(2))
        started = time.monotonic()
        ups = [dtask.submit("bench_noop", {"n": 1}) for _ in range(args.fan_in)]
        submitted = time.monotonic() - started
        last = dtask.submit("bench_noop", {"n": 1}, after=ups)
        last.wait(timeout=3600)
        fan_in = time.monotonic() - started
        ids = [u.id for u in ups]
        _check(store.engine, [*ids, last.id])
        (gap,) = _latencies(store.engine, [(last.id, ids)])
        rows.append(
            f"| fan-in: {args.fan_in:,} upstream runs -> 1 | {fan_in:.1f} s"
            f" (submit {submitted:.1f} s) | {gap * 1000:.0f} ms | - |"
        )

        started = time.monotonic()
        chain = [dtask.submit("bench_noop", {"n": 1})]
        for _ in range(args.chain - 1):
            chain.append(dtask.submit("bench_noop", {"n": 1}, after=[chain[-1]]))
        chain[-1].wait(timeout=3600)
        elapsed = time.monotonic() - started
        _check(store.engine, [r.id for r in chain])
        gaps = _latencies(store.engine, [(b.id, [a.id]) for a, b in itertools.pairwise(chain)])
        rows.append(
            f"| chain of {args.chain} runs | {elapsed:.1f} s ({elapsed / args.chain * 1000:.0f}"
            f" ms per link) | {statistics.median(gaps) * 1000:.0f} ms |"
            f" {_pct(gaps, 0.99) * 1000:.0f} ms (max {max(gaps) * 1000:.0f}) |"
        )
    finally:
        workers.stop_all()
        from dtask.services import embedded

        embedded.stop(Path(os.environ["DTASK_HOME"]))
    table = "\n".join(
        [
            "| shape | wall time | last upstream finalized -> first child, p50 | p99 |",
            "|---|---:|---:|---:|",
            *rows,
        ]
    )
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "deps.md").write_text(table + "\n")
    print(table)
    print(f"(logs in {work})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
