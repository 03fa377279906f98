"""dtask against what its users would pick instead, side by side on this machine: stock
Celery (a chord with Celery's defaults) and Dramatiq (a group with a completion callback), on
the same embedded Redis, 2 worker processes each, N no-op children from one submitter, the
systems' runs alternating.

    .venv/bin/python -m bench.peers [--sizes 2000,10000] [--repeats 3]

Prints a Markdown table (also bench/out/peers.md): each system's median seconds and
children/s, and dtask's time as a ratio of each other system's. Procrastinate is not here yet.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment

SYSTEMS = ("dtask", "celery", "dramatiq")
OUT = REPO / "bench" / "out" / "peers.md"


def dramatiq_fanout(n: int) -> float:
    out = subprocess.run(
        [sys.executable, "-m", "bench.dramatiq_client", str(n)],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=3600,
    )  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])


def one(system: str, n: int, engine: Any) -> float:
    from bench import measure

    if system == "dtask":
        return measure.dtask_fanout(engine, n, {}).seconds
    if system == "celery":
        return measure.raw_fanout(n, {}).seconds
    return dramatiq_fanout(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,10000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = prepare_environment(DTASK_BENCH_RAW="stock")
    from dtask import services
    from dtask.services import embedded

    resolved = services.ensure_broker()
    os.environ["DTASK_BENCH_REDIS_SOCKET"] = str(embedded.redis_socket(resolved.settings.home))
    engine = services.store().engine
    workers = Workers(work)
    seconds: dict[tuple[str, int], list[float]] = {}
    try:
        workers.ready(workers.dtask(2))
        workers.raw(2)
        workers.quiet.add(
            workers._spawn(
                [sys.executable, "-m", "dramatiq", "bench.dramatiq_app",
                 "--processes", "2", "--threads", "1"],
                "dramatiq",
            ).pid
        )  # fmt: skip
        for system in SYSTEMS:  # warm-up: imports, connections, queues
            one(system, 100, engine)
        for n in [int(s) for s in args.sizes.split(",")]:
            for rep in range(args.repeats):
                for system in SYSTEMS[rep % 3 :] + SYSTEMS[: rep % 3]:
                    took = one(system, n, engine)
                    seconds.setdefault((system, n), []).append(took)
                    print(f"{system} N={n:,}: {took:.1f} s ({n / took:,.0f}/s)", flush=True)
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    table = _table(seconds)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(table + "\n")
    print(table)
    return 0


def _table(seconds: dict[tuple[str, int], list[float]]) -> str:
    sizes = sorted({n for _, n in seconds})
    lines = [
        f"`python -m bench.peers` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}:"
        " median seconds (children/s) of each system's runs, and dtask's time over each.",
        "",
        "| N | dtask | stock Celery | Dramatiq | dtask / Celery | dtask / Dramatiq |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        med = {s: statistics.median(seconds[(s, n)]) for s in SYSTEMS}
        cells = [f"{med[s]:.1f} s ({n / med[s]:,.0f}/s)" for s in SYSTEMS]
        lines.append(
            f"| {n:,} | {' | '.join(cells)} | {med['dtask'] / med['celery']:.2f}x"
            f" | {med['dtask'] / med['dramatiq']:.2f}x |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
