"""What one ``dtask.submit`` costs the submitting process: N submits of a one-child run
(template ``bench_one``) in one process against the embedded PostgreSQL and Redis, no worker
(a submit only inserts the run and publishes its master message).

    .venv/bin/python -m bench.submit_cost [--runs 500] [--rounds 5] [--profile]

Prints wall and CPU milliseconds per submit, the median of ``rounds`` rounds of ``runs``
submits (after one warm-up submit), and each round's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

from bench.cluster import prepare_environment


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    work = prepare_environment()
    import dtask
    from dtask import services
    from dtask.services import embedded

    try:
        services.store()  # the embedded services, migrated
        dtask.submit("bench_one", {})  # imports, connections, the template
        profile = cProfile.Profile() if args.profile else None
        walls, cpus = [], []
        for _ in range(args.rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            if profile:
                profile.enable()
            for _ in range(args.runs):
                dtask.submit("bench_one", {})
            if profile:
                profile.disable()
            walls.append(1000 * (time.perf_counter() - wall) / args.runs)
            cpus.append(1000 * (time.process_time() - cpu) / args.runs)
    finally:
        services.reset()
        embedded.stop(work / "home")
    report = {
        "runs": args.runs,
        "wall_ms_per_submit": round(statistics.median(walls), 3),
        "cpu_ms_per_submit": round(statistics.median(cpus), 3),
        "rounds_wall_ms": [round(w, 3) for w in walls],
    }
    print(json.dumps(report))
    if profile:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
