"""Where a fan-out's time goes: one run of N no-op children on 2 workers x 2 processes (as
bench.peers), then its milestones read back from PostgreSQL, in milliseconds after submit:
the master's start, the first child sent (after the split's commit), started and finished, the
last child sent, started and finished, and the run finished.

    .venv/bin/python -m bench.fanout_timeline [--n 10000] [--repeats 3] [--env DTASK_X=Y ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.cluster import Workers, prepare_environment

MILESTONES = {
    "master started": "max(r.started_at)",
    "first sent": "min(c.sent_at)",
    "first started": "min(c.started_at)",
    "first finished": "min(c.finished_at)",
    "last sent": "max(c.sent_at)",
    "last started": "max(c.started_at)",
    "last finished": "max(c.finished_at)",
    "run finished": "max(r.finished_at)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--passes", action="store_true", help="each send's time and size")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the cluster")
    args = parser.parse_args()
    work = prepare_environment(**dict(e.split("=", 1) for e in args.env))
    import sqlalchemy as sa

    import dtask
    from bench.measure import wait_run
    from dtask import services

    engine = services.store().engine
    workers = Workers(work)
    try:
        workers.ready(workers.dtask(2), workers.dtask(2))
        rows: dict[str, list[float]] = {name: [] for name in MILESTONES}
        for i in range(args.repeats + 1):  # the first one warms the workers up
            start = time.time()
            run = dtask.submit("bench_noop", {"n": args.n})
            wait_run(engine, run.id, timeout=600, poll=0.2)
            columns = ", ".join(f"extract(epoch from {sql})" for sql in MILESTONES.values())
            with engine.connect() as conn:
                found = conn.execute(
                    sa.text(
                        f"SELECT {columns} FROM dtask_children c JOIN dtask_runs r"
                        " ON r.id = c.run_id WHERE c.run_id = :id"
                    ),
                    {"id": run.id},
                ).one()
            if i == 0:
                continue
            if args.passes:
                with engine.connect() as conn:
                    sends = conn.execute(
                        sa.text(
                            "SELECT extract(epoch from sent_at), count(*) FROM dtask_children"
                            " WHERE run_id = :id GROUP BY 1 ORDER BY 1"
                        ),
                        {"id": run.id},
                    ).all()
                print(f"run {run.id}: {len(sends)} sends (ms after submit: children)")
                print("  " + " ".join(f"{1000 * (float(t) - start):.0f}:{n}" for t, n in sends))
            for name, at in zip(MILESTONES, found, strict=True):
                rows[name].append(1000 * (float(at) - start) if at is not None else float("nan"))
        print(f"N={args.n:,}, {args.repeats} runs, ms after submit (median, then each run)")
        for name, values in rows.items():
            each = " ".join(f"{v:7.0f}" for v in values)
            print(f"  {name:<24} {statistics.median(values):7.0f}   {each}")
    finally:
        workers.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
