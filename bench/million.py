"""Very large runs through the dispatcher: the broker holds its window, not the run.

    python -m bench.million [--sizes 100000,1000000] [--workers 1] [--concurrency 2]

No-op children (``bench_noop``) on dtask workers with the default settings (DTASK_MAX_CHILDREN
raised to the largest size), one run per size, one after the other. Every half second it
samples the broker (the length of the queue's lists, Redis ``used_memory``), PostgreSQL
(children sent and not yet claimed) and the peak RSS of every process of the cluster; at the
end it checks that every child succeeded exactly once and the run ended succeeded. Prints the
time, the rate and the largest samples per size, and the ratio of each time to the first
(bench/out/million.json keeps them).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = prepare_environment(DTASK_MAX_CHILDREN=str(max(*sizes, 100_000)))
    from bench import procs
    from bench.measure import redis_client
    from dtask import services
    from dtask.services import embedded

    engine = services.store().engine
    broker = redis_client()
    workers = Workers(work)
    started = [workers.dtask(args.concurrency) for _ in range(args.workers)]
    workers.ready()
    roles = {p.pid: "dtask" for p in started}
    results: list[dict[str, Any]] = []
    ok = True
    try:
        for n in sizes:
            one = _one(engine, broker, roles, n, procs)
            results.append(one)
            ok = ok and one["ok"]
            _print(one, results[0])
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "million.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


def _one(engine: Any, broker: Any, roles: dict[int, str], n: int, procs: Any) -> dict[str, Any]:
    from sqlalchemy import text

    import dtask

    samples: list[tuple[int, int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            lists = sum(int(broker.llen(k)) for k in broker.scan_iter("dtask*"))
            memory = int(broker.info("memory")["used_memory"])
            with engine.connect() as conn:
                out = conn.execute(
                    text(
                        "SELECT count(*) FROM dtask_children WHERE state = 'pending'"
                        " AND sent_at IS NOT NULL"
                    )
                ).scalar_one()
            samples.append((lists, memory, int(out)))

    sampler = threading.Thread(target=sample, daemon=True)
    rss = procs.PeakRss(roles)
    rss.start()
    before = int(broker.info("memory")["used_memory"])
    start = time.time()
    run = dtask.submit("bench_noop", {"n": n})
    sampler.start()
    try:
        status = run.wait(timeout=6 * 3600, poll=2.0)
    finally:
        stop.set()
        sampler.join()
        peaks = rss.stop()
    with engine.connect() as conn:
        row: Any = conn.execute(
            text(
                "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'succeeded') AS ok,"
                " max(attempt) AS attempts FROM dtask_children WHERE run_id = :r"
            ),
            {"r": run.id},
        ).one()
        finished = conn.execute(
            text("SELECT finished_at FROM dtask_runs WHERE id = :r"), {"r": run.id}
        ).scalar_one()
    seconds = finished.timestamp() - start
    largest: dict[str, float] = {}
    for role, value in peaks.values():
        largest[role] = max(largest.get(role, 0.0), value / 2**20)
    return {
        "n": n,
        "run": run.id,
        "state": status.state.value,
        "succeeded": int(row.ok),
        "children": int(row.n),
        "highest_attempt": row.attempts,
        "seconds": seconds,
        "rate": n / seconds,
        "rss_mb": largest,
        "redis_mb_before": before / 2**20,
        "redis_mb_peak": max((s[1] for s in samples), default=before) / 2**20,
        "broker_messages_peak": max((s[0] for s in samples), default=0),
        "sent_unclaimed_peak": max((s[2] for s in samples), default=0),
        "ok": status.state is dtask.RunState.SUCCEEDED and row.ok == row.n == n,
    }


def _print(one: dict[str, Any], first: dict[str, Any]) -> None:
    rss = ", ".join(f"{r} {mb:.0f} MB" for r, mb in sorted(one["rss_mb"].items()))
    print(
        f"N={one['n']:,}: run {one['run']} {one['state']}, {one['succeeded']:,}/"
        f"{one['children']:,} children succeeded, highest attempt {one['highest_attempt']},"
        f" {one['seconds']:.0f} s ({one['rate']:.0f}/s), time / time(N={first['n']:,}) ="
        f" {one['seconds'] / first['seconds']:.1f}\n  peak RSS: {rss}\n"
        f"  Redis used_memory {one['redis_mb_before']:.1f} MiB before, at most"
        f" {one['redis_mb_peak']:.1f} MiB; broker lists at most {one['broker_messages_peak']}"
        f" messages; sent and unclaimed at most {one['sent_unclaimed_peak']:,} children",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
