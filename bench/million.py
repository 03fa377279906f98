"""One very large run through the dispatcher: the broker holds its window, not the run.

    python -m bench.million --children 1000000 [--workers 2] [--concurrency 1]

No-op children (``bench_noop``) on dtask workers with the default settings (DTASK_MAX_CHILDREN
raised to the run's size). Every half second it samples the broker (the length of the
queue's lists, Redis ``used_memory``) and PostgreSQL (children sent and not yet claimed);
at the end it checks that every child succeeded exactly once and the chord callback ended
the run. Prints the split time, the rate and the largest samples.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from bench.cluster import Workers, prepare_environment


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    work = prepare_environment(DTASK_MAX_CHILDREN=str(max(args.children, 100_000)))
    from sqlalchemy import text

    import dtask
    from bench.measure import redis_client
    from dtask import services

    engine = services.store().engine
    broker = redis_client()
    workers = Workers(work)
    for _ in range(args.workers):
        workers.dtask(args.concurrency)
    workers.ready()
    samples: list[tuple[float, int, int, int]] = []
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
            samples.append((time.monotonic(), lists, memory, int(out)))

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        before = int(broker.info("memory")["used_memory"])
        start = time.monotonic()
        run = dtask.submit("bench_noop", {"n": args.children})
        sampler.start()
        status = run.wait(timeout=6 * 3600, poll=2.0)
        took = time.monotonic() - start
    finally:
        stop.set()
        workers.stop_all()
    try:
        return _report(engine, run, status, took, samples, before, args.children)
    finally:
        from dtask.services import embedded

        services.reset()
        embedded.stop(work / "home")


def _report(
    engine: Any, run: Any, status: Any, took: float, samples: list[Any], before: int, n: int
) -> int:
    from sqlalchemy import text

    import dtask

    with engine.connect() as conn:
        row: Any = conn.execute(
            text(
                "SELECT count(*) AS n, count(*) FILTER (WHERE state = 'succeeded') AS ok,"
                " max(attempt) AS attempts, min(started_at) AS first, max(finished_at) AS last"
                " FROM dtask_children WHERE run_id = :r"
            ),
            {"r": run.id},
        ).one()
        split = conn.execute(
            text("SELECT started_at - created_at FROM dtask_runs WHERE id = :r"), {"r": run.id}
        ).scalar_one()
    print(
        f"run {run.id}: {status.state.value}, {row.ok:,}/{row.n:,} children succeeded,"
        f" highest attempt {row.attempts}, {took:.0f} s ({n / took:.0f}/s)"
    )
    print(f"first child {row.first}, split and start took {split}")
    if samples:
        print(
            f"broker lists: at most {max(s[1] for s in samples)} messages;"
            f" sent and unclaimed in PostgreSQL: at most {max(s[3] for s in samples)};"
            f" Redis used_memory {before / 2**20:.1f} MiB before, at most"
            f" {max(s[2] for s in samples) / 2**20:.1f} MiB during ({len(samples)} samples)"
        )
    ok = status.state is dtask.RunState.SUCCEEDED and row.ok == row.n == n
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
