"""The dtask side of many one-child runs, in process and without a worker: ``submit_many``'s
runs (their ``dtask.masters`` messages left in the broker), then the ``dtask.masters`` task's
body called here for them, ``--per`` runs at a time. What a pool process and PostgreSQL pay
per small run, with its statements.

    .venv/bin/python -m bench.master_path [--n 2000] [--per 50] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import procs
from bench.cluster import prepare_environment


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--per", type=int, default=50, help="runs per dtask.masters call")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    prepare_environment()
    from sqlalchemy import event

    import dtask
    from dtask import services
    from dtask.services import embedded
    from dtask.worker import configure, tasks

    configure()
    store = services.store()
    try:

        def runs(n: int) -> list[int]:
            found = dtask.submit_many("bench_one", [{}] * n)
            return [s.run_id for s in found if s.run_id is not None]

        def masters(ids: list[int]) -> None:
            for first in range(0, len(ids), args.per):
                tasks.masters.run("bench_one", 0, ids[first : first + args.per])

        masters(runs(200))  # warm: imports, connections, the template's child time
        ids = runs(args.n)
        statements: Counter[str] = Counter()

        @event.listens_for(store.db.engine, "before_cursor_execute")
        def count(conn: Any, cursor: Any, text: str, *rest: Any) -> None:
            statements[" ".join(text.split()[:3])] += 1

        profiler = cProfile.Profile() if args.profile else None
        before = procs.snapshot({})
        start = time.perf_counter()
        if profiler:
            profiler.enable()
        masters(ids)
        if profiler:
            profiler.disable()
        seconds = time.perf_counter() - start
        cpu = procs.cpu_by_role(before, procs.snapshot({}))
        per = {role: f"{1e6 * s / len(ids):.0f} us" for role, s in cpu.items()}
        counted = statements.copy()
        done = sum(1 for i in ids if store.runs.get(i).state.value == "succeeded")
        print(
            f"{done}/{len(ids)} succeeded; {1e6 * seconds / len(ids):.0f} us wall per run;"
            f" CPU per run: {per}"
        )
        total = sum(counted.values())
        print(f"{total / len(ids):.2f} statements per run (BEGIN/COMMIT not counted):")
        for text, n in counted.most_common():
            print(f"  {n / len(ids):6.2f}  {text}")
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    finally:
        embedded.stop(Path(os.environ["DTASK_HOME"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
