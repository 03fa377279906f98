"""What idle workers cost PostgreSQL: N `dtask worker -P threads -c 4` doing nothing for 30 s
against a private PostgreSQL with pg_stat_statements (bench/postgres.py); statements a second,
in all and per worker, and the most frequent ones.

    .venv/bin/python -m bench.idle 16
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench import postgres
from bench.cluster import Workers, prepare_environment

SECONDS = 30


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    work = prepare_environment()
    url = postgres.start()
    from dtask.services import embedded

    redis = embedded.ensure_redis(work / "home")
    os.environ.update(DTASK_DATABASE_URL=url, DTASK_BROKER_URL=redis, DTASK_RESULT_BACKEND=redis)
    from sqlalchemy import text

    from dtask.db import Limits, engine_for

    dtask_bin = str(Path(sys.executable).with_name("dtask"))
    subprocess.run([dtask_bin, "migrate"], check=True, capture_output=True)
    server = engine_for(url, Limits(connections=2, pooler="none"))
    with server.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    workers = Workers(work)
    try:
        for i in range(count):
            workers.dtask(4, f"idle{i}@%h", "-P", "threads")
        workers.ready(timeout=300)
        time.sleep(5)  # past their start-up
        with server.begin() as conn:
            conn.execute(text("SELECT pg_stat_statements_reset()"))
        time.sleep(SECONDS)  # the quantity measured: statements over idle time
        with server.begin() as conn:
            rows = conn.execute(
                text("SELECT query, calls FROM pg_stat_statements ORDER BY calls DESC")
            ).all()
    finally:
        workers.stop_all()
        embedded.stop(work / "home")
    total = sum(int(r.calls) for r in rows) / SECONDS
    print(f"{count} idle workers: {total:.0f} statements/s, {total / count:.1f} per worker")
    for row in rows[:8]:
        print(f"  {row.calls / SECONDS:7.1f}/s  {row.query[:90]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
