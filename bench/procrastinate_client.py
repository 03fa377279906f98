"""Defer N Procrastinate no-op jobs and wait until all have succeeded. Procrastinate has no
fan-in, so there is no callback to wait on: the jobs go in with ``Task.batch_defer``, its
documented way to defer many jobs at once ("more efficient than deferring them one by one":
one INSERT through ``procrastinate_defer_jobs_v1``), and the client polls its jobs table for
any of them still to do or doing (a partial index covers exactly those). The time is the last
job's ``succeeded`` event (the events table, written by Procrastinate's own trigger), so
polling slowly costs no precision. Prints one JSON line: seconds (defer to the last job done),
sent, and workers (how many worker processes ran the jobs).

    python -m bench.procrastinate_client N
"""

from __future__ import annotations

import json
import os
import sys
import time

import psycopg

from bench.procrastinate_app import app, child

REMAINING = (
    "SELECT count(*) FROM procrastinate_jobs"
    " WHERE id BETWEEN %s AND %s AND status IN ('todo', 'doing')"
)
LAST_DONE = (
    "SELECT count(*), max(at) FROM procrastinate_events"
    " WHERE job_id BETWEEN %s AND %s AND type = 'succeeded'"
)
WORKERS = "SELECT count(DISTINCT worker_id) FROM procrastinate_jobs WHERE id BETWEEN %s AND %s"


def main() -> int:
    n = int(sys.argv[1])
    with app.open(), psycopg.connect(os.environ["DTASK_BENCH_PROCRASTINATE_DSN"]) as conn:
        conn.autocommit = True
        warm = child.defer(a=0, b=0)
        _wait(conn, [warm], 60, 0.05)  # the workers are up and fetching
        start = time.time()
        ids = child.batch_defer(*({"a": i, "b": i} for i in range(1, n + 1)))
        sent = time.time() - start
        done, last = _wait(conn, ids, 1800, 0.2)
        row = conn.execute(WORKERS, (min(ids), max(ids))).fetchone()
    assert done == n, (done, n)
    workers = row[0] if row else 0  # worker processes that ran them (2 when both took some)
    print(json.dumps({"seconds": last - start, "sent": sent, "workers": workers}), flush=True)
    return 0


def _wait(
    conn: psycopg.Connection, ids: list[int], timeout: float, poll: float
) -> tuple[int, float]:
    """(jobs succeeded, when the last one did) once none of ``ids`` is left to do."""
    low, high = min(ids), max(ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        remaining = conn.execute(REMAINING, (low, high)).fetchone()
        if remaining is not None and remaining[0] == 0:
            row = conn.execute(LAST_DONE, (low, high)).fetchone()
            assert row is not None and row[1] is not None, row
            return int(row[0]), row[1].timestamp()
        time.sleep(poll)
    raise SystemExit(f"Procrastinate jobs {low}..{high} not all done after {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
