"""How long one beat pass (``dtask.worker.beat.beat_pass``) takes with many schedules.

    .venv/bin/python -m bench.beat [--sizes 1000,10000,100000] [--passes 5] [--profile]

On an embedded PostgreSQL and Redis in a temp dir, fills ``dtask_schedules`` to each size
(55 kinds saved with ``dtask.add_schedule``: crons such as ``*/5 * * * *`` and ``0 3 * * *``
in seven time zones, intervals of 1 min to 1 day, and 1% of rows every 5 s; the rest cloned
from them in SQL), then times one cold pass (every schedule due: a new table, or a beat back
from an outage) and passes in two steady states: none due (most passes), and the 1% of
every-5-s rows due (one slot each). A pass reads only the due schedules (``next_due_at``), in
chunks. Prints a Markdown table of the median and max pass, the runs each pass created, and
any warning or error a pass logged or raised (such as "held past its limit"); ``--profile``
adds cProfile's top 10 (cumulative) of one more pass in each state at the largest size.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import logging
import pstats
import shutil
import statistics
import time
from collections import Counter
from typing import Any

from bench.cluster import prepare_environment

CRONS = ["*/5 * * * *", "0 3 * * *", "*/15 * * * *", "0 * * * *", "30 8 * * 1-5", "0 0 1 * *"]
CRONS += ["15 2 * * 0"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Sydney"]
ZONES += ["America/Sao_Paulo", "Asia/Kolkata"]
KINDS: list[dict[str, Any]] = [
    {"every": 5},
    *({"cron": c, "tz": z, "misfire": "run_once" if z == "Asia/Tokyo" else "skip"}
      for c in CRONS for z in ZONES),
    *({"every": s, "overlap": "skip"} for s in (60, 300, 900, 3600, 86400)),
]  # fmt: skip
COLUMNS = (
    "template, variables, cron, every_seconds, timezone, misfire, overlap, misfire_grace,"
    " catch_up_window, start_at, end_at, delay_tolerance, on_late, after_schedule"
)


class Caught(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: Counter[str] = Counter()
        self.example: dict[str, str] = {}
        self.created: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.note(str(record.msg), record.getMessage())

    def note(self, kind: str, message: str) -> None:
        self.messages[kind] += 1
        self.example.setdefault(kind, message)


def fill(engine: Any, size: int) -> None:
    from sqlalchemy import text

    with engine.begin() as conn:
        have = conn.execute(text("SELECT count(*) FROM dtask_schedules")).scalar_one()
        conn.execute(
            text(
                f"INSERT INTO dtask_schedules (name, {COLUMNS}, decided_until)"
                f" SELECT 'bench-' || g, {COLUMNS}, now()"
                " FROM generate_series(CAST(:first AS int), CAST(:last AS int)) g"
                " JOIN dtask_schedules k ON k.name = 'kind-'"
                "   || CASE WHEN g % 100 = 0 THEN 0 ELSE 1 + g % :others END"
            ),
            {"first": have + 1, "last": size, "others": len(KINDS) - 1},
        )
    vacuum(engine, "VACUUM ANALYZE")


def vacuum(engine: Any, command: str = "VACUUM dtask_schedules") -> None:
    from sqlalchemy import text

    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(command))


def prepare(engine: Any, due: bool) -> None:
    """Just past a 5 s slot: the every-5-s rows (1%) are due; without ``due``, a pass decides
    them first, so the timed pass finds none due (the steady state of most passes)."""
    from dtask.worker.beat import beat_pass

    vacuum(engine)
    time.sleep(5.1 - time.time() % 5)
    if not due:
        beat_pass()


def cold(engine: Any, caught: Caught) -> float:
    """Every schedule due at once (a new table, or a beat back after a long outage)."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("UPDATE dtask_schedules SET decided_until = now(), next_due_at = now()"))
    vacuum(engine)
    return one_pass(engine, caught)


def runs(engine: Any) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM dtask_runs")).scalar_one())


def one_pass(engine: Any, caught: Caught, profile: cProfile.Profile | None = None) -> float:
    from dtask.worker.beat import beat_pass

    before = runs(engine)
    started = time.perf_counter()
    try:
        if profile is None:
            beat_pass()
        else:
            profile.runcall(beat_pass)
    except Exception as exc:
        caught.note(type(exc).__name__, f"raised {type(exc).__name__}: {exc}")
    elapsed = time.perf_counter() - started
    caught.created.append(runs(engine) - before)
    return elapsed


def measure(engine: Any, size: int, due: bool, passes: int) -> tuple[str, list[str]]:
    caught = Caught()
    logging.getLogger("dtask.beat").addHandler(caught)
    try:
        times = []
        if not due:
            print(f"{size:,} cold (all due): {cold(engine, caught):.3f} s", flush=True)
            caught.created.clear()
        for _ in range(passes):
            prepare(engine, due)
            times.append(one_pass(engine, caught))
    finally:
        logging.getLogger("dtask.beat").removeHandler(caught)
    made = caught.created
    fired = f"{min(made):,}" if min(made) == max(made) else f"{min(made):,}-{max(made):,}"
    label = f"{size:,} ({'1% due' if due else 'none due'})"
    row = f"| {label} | {statistics.median(times):.3f} | {max(times):.3f} | {fired} |"
    notes = [
        f"{label}: {n}x in {passes} passes, e.g. {caught.example[kind]}"
        for kind, n in caught.messages.items()
    ]
    return row, notes


def profiled(engine: Any, due: bool) -> str:
    caught, profile = Caught(), cProfile.Profile()
    prepare(engine, due)
    one_pass(engine, caught, profile)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(10)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if sizes[0] < len(KINDS):
        parser.error(f"sizes start at {len(KINDS)} (one schedule of each kind)")
    work = prepare_environment()
    import dtask
    from dtask import services, templating
    from dtask.services import embedded

    rows, notes, profiles = [], [], []
    try:
        templating.load_templates()
        engine = services.store().engine
        for i, kind in enumerate(KINDS):
            dtask.add_schedule(f"kind-{i}", "bench_noop", {"n": 1}, **kind)
        for size in sizes:
            started = time.perf_counter()
            fill(engine, size)
            print(f"filled to {size:,} in {time.perf_counter() - started:.1f} s", flush=True)
            for due in (False, True):
                row, found = measure(engine, size, due, args.passes)
                rows.append(row)
                notes += found
                print(row, flush=True)
        if args.profile:
            profiles = [profiled(engine, due) for due in (False, True)]
    finally:
        services.reset()
        embedded.stop(work / "home")
        shutil.rmtree(work, ignore_errors=True)
    print("\n| schedules | pass median s | pass max s | runs fired per pass |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    print("\n".join(["", *notes]) if notes else "\nno pass logged a warning or raised")
    for state, text in zip(("none due", "1% due"), profiles, strict=False):
        print(f"\ncProfile of one pass at {sizes[-1]:,} schedules ({state}):\n{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
