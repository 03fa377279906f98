"""The query plans of what runs often (the reaper's pass, the monitor's facts, a status poll,
the dispatcher's pass) on a database of a million child rows: EXPLAIN (ANALYZE, BUFFERS) of
each statement dtask itself sends, captured as it runs. Prints Markdown (and writes
bench/out/plans.md).

    .venv/bin/python -m bench.plans [--url postgresql+psycopg://postgres@127.0.0.1/dtask_plans]

The database must exist and be empty (or dtask's own); it is migrated, filled with ten runs
of 100,000 children (nine finished, one running: half done, 2,000 running, the rest pending)
and left so.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text

REPO = Path(__file__).resolve().parents[1]
SEQ = re.compile(r"Seq Scan on (\w+)")


def fill(engine: Any, runs: int, children: int) -> int:
    """``runs`` runs of ``children`` each, the last one running; its id."""
    with engine.begin() as conn:
        for i in range(runs):
            live = i == runs - 1
            run_id = conn.execute(
                text(
                    "INSERT INTO dtask_runs (template, trigger_key, variables, state, max_attempts,"
                    " child_total, chord_size, dispatches, group_id, finished_at, started_at)"
                    " VALUES ('bench_noop', :key, '{}', :state, 3, :n, :n, 1, 'g', "
                    " CASE WHEN :live THEN NULL ELSE now() - interval '1 day' END, now())"
                    " RETURNING id"
                ),
                {"key": f"plans-{i}-{time.time()}", "state": "running" if live else "succeeded",
                 "n": children, "live": live},
            ).scalar_one()  # fmt: skip
            conn.execute(
                text(
                    "INSERT INTO dtask_children (run_id, index, spec, max_attempts, state, attempt,"
                    " sent_at, started_at, finished_at, owner, lease_expires_at) SELECT :id, g,"
                    " jsonb_build_object('a', g, 'b', g), 3,"
                    " CASE WHEN NOT :live OR g < :n / 2 THEN 'succeeded'"
                    "   WHEN g < :n / 2 + 2000 THEN 'running' ELSE 'pending' END, 1,"
                    " now(), now(), CASE WHEN NOT :live OR g < :n / 2 THEN now() END,"
                    " CASE WHEN :live AND g >= :n / 2 AND g < :n / 2 + 2000 THEN 'h:1' END,"
                    " CASE WHEN :live AND g >= :n / 2 AND g < :n / 2 + 2000"
                    "   THEN now() + interval '1 hour' END"
                    " FROM generate_series(0, :n - 1) g"
                ),
                {"id": run_id, "n": children, "live": live},
            )
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return int(run_id)


def _facts(store: Any) -> None:
    from dtask.db.alerts import _facts as facts

    with store.db.tx() as conn:
        facts(conn, 3600.0, 600.0)  # the default DTASK_STALL_ALERT


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql+psycopg://postgres@127.0.0.1/dtask_plans")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--children", type=int, default=100_000)
    args = parser.parse_args()

    from dtask.db import Database, Store, schema

    engine = create_engine(args.url)
    schema.upgrade(engine)
    live = fill(engine, args.runs, args.children)
    store = Store(Database(engine))
    seen: list[tuple[str, str, Any]] = []
    label = ["?"]

    @event.listens_for(engine, "before_cursor_execute")
    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH", "DELETE")) and (
            "pg_try_advisory" not in statement or "dtask_runs" in statement
        ):
            seen.append((label[0], statement, params))

    steps = {
        "status poll (dtask status --watch, Run.wait)": lambda: store.runs.status(live),
        "reaper: unfinalized runs": lambda: store.recovery.unfinalized_runs(5.0),
        "reaper: expired leases": lambda: store.recovery.release_expired(),
        "reaper: stuck runs": lambda: store.recovery.take_stuck(15.0),
        "reaper: waiting runs to settle": lambda: store.recovery.settle_waiting(),
        "reaper: runs past their deadline": lambda: store.recovery.take_late(),
        "reaper: messages that should be waiting (lost)": lambda: store.recovery.waiting(15.0),
        "monitor: alert facts": lambda: _facts(store),
    }
    for name, step in steps.items():
        label[0] = name
        step()
    event.remove(engine, "before_cursor_execute", capture)
    summary = [
        f"Plans at {args.runs * args.children:,} child rows ({args.runs} runs of"
        f" {args.children:,}; run {live} running: half done, 2,000 running, the rest pending),"
        " from `python -m bench.plans`. Each statement is one dtask sends, captured as it ran.",
        "",
        "| step | statement | execution | sequential scans |",
        "|---|---|---:|---|",
    ]
    details: list[str] = []
    with engine.connect() as conn:
        for name, statement, params in seen:
            tx = conn.begin()
            raw = conn.connection.driver_connection
            with raw.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, params)
                plan = [row[0] for row in cursor.fetchall()]
            tx.rollback()
            timing = next((line for line in plan if line.startswith("Execution Time")), "")
            scans = sorted(
                {
                    m.group(1)
                    for line in plan
                    for m in [SEQ.search(line)]
                    if m and "never" not in line
                }
            )
            short = " ".join(statement.split())[:90].replace("|", "/")
            ms = timing.removeprefix("Execution Time: ")
            summary.append(f"| {name} | `{short}...` | {ms} | {', '.join(scans) or 'none'} |")
            details += [f"### {name}", "", "```sql", " ".join(statement.split()), "```", "",
                        "```", *plan, "```", ""]  # fmt: skip
    out = [*summary, "", *details]
    text_out = "\n".join(out)
    (REPO / "bench" / "out").mkdir(exist_ok=True)
    (REPO / "bench" / "out" / "plans.md").write_text(text_out)
    print(text_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
