"""Many small runs: N runs of one 1-ms child each (template ``bench_one``), submitted by
several processes with ``dtask.submit``, against stock Celery doing the same work: N 1-ms
tasks (``raw.sleep1ms``) sent with ``.delay()`` by as many processes. 2 worker processes
each (``dtask worker -c 2``, ``celery worker -c 2``), on the same embedded PostgreSQL and
Redis; the other system's worker stays up, idle.

    .venv/bin/python -m bench.small_runs [--runs 10000] [--submitters 4] [--system all]
                                         [--pickup 1]

dtask: runs/s = runs / (the latest run's ``finished_at`` - the first submit call's start).
Stock Celery: tasks/s = tasks / (the latest result's ``date_done`` - the first ``.delay()``'s
start): every task's result is read back from the result backend (Redis, one MGET per 1,000
ids every 0.2 s), so completion means "all N results ready", with the time the worker wrote
them. Each submitter warms up (one submit or task, waited for) before a common start; it
reports how long its own submitting took and the CPU it used, so the client-side submit
cost is visible on its own. Prints a summary and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment

FINISHED = ("succeeded", "failed", "cancelled")


# --- submitter processes (each its own interpreter and connections) -----------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def submitter(system: str, count: int) -> None:
    """In a submitter process: warm up (one submit, waited for), say "ready", wait for "go"
    on stdin, submit ``count`` times, print one JSON line (start, end, CPU, per call, ids)."""
    if system in ("dtask", "bulk"):
        import dtask

        dtask.submit("bench_one", {}).wait(timeout=60)  # imports, connections, the template
        send = lambda: dtask.submit("bench_one", {}).id  # noqa: E731
    else:
        from bench.raw_app import sleep1ms

        sleep1ms.delay().get(timeout=60)  # the worker is up and this process connected
        send = lambda: sleep1ms.delay().id  # noqa: E731
    print("ready", flush=True)
    sys.stdin.readline()
    cpu, start = _cpu(), time.time()
    calls, ids = [], []
    if system == "bulk":  # every run of this submitter in one submit_many call
        found = dtask.submit_many("bench_one", [{}] * count)
        ids = [s.run_id for s in found if s.run_id is not None]
        calls = [time.time() - start]
        count = 0
    for _ in range(count):
        t = time.perf_counter()
        ids.append(send())
        calls.append(time.perf_counter() - t)
    end = time.time()
    report = {"start": start, "end": end, "cpu": _cpu() - cpu, "calls": calls, "ids": ids}
    print(json.dumps(report), flush=True)


def _submit(system: str, runs: int, submitters: int) -> list[dict[str, Any]]:
    """Start the submitters, let them warm up, release them together; their reports."""
    shares = [runs // submitters + (i < runs % submitters) for i in range(submitters)]
    argv = [sys.executable, "-m", "bench.small_runs", "--submitter", system, "--runs"]
    procs = [
        subprocess.Popen(
            [*argv, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
        )
        for n in shares
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            for line in proc.stdout:  # anything it printed while warming up comes first
                if line.strip() == "ready":
                    break
            else:
                raise RuntimeError(f"a {system} submitter did not start")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=3600)
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return reports


def _submit_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    calls = sorted(c for r in reports for c in r["calls"])
    first = min(r["start"] for r in reports)
    wall = max(r["end"] for r in reports) - first
    return {
        "first_submit": first,
        "submit_seconds": wall,
        "submits_per_s": len(calls) / wall,
        "submit_ms_p50": 1000 * statistics.median(calls),
        "submit_ms_p99": 1000 * calls[int(0.99 * (len(calls) - 1))],
        "submit_ms_mean": 1000 * statistics.fmean(calls),
        "submitter_cpu_s": sum(r["cpu"] for r in reports),
    }


# --- the two sides -------------------------------------------------------------------------


def dtask_small_runs(
    engine: Any, runs: int, submitters: int, roles: dict[int, str], system: str = "dtask"
) -> dict[str, Any]:
    """``runs`` runs of ``bench_one`` from ``submitters`` processes (``system`` "bulk": one
    ``submit_many`` call each); the dtask worker must be up. Returns runs/s and the submit
    cost."""
    from sqlalchemy import text

    from bench import procs

    with engine.connect() as conn:
        base = conn.execute(text("SELECT coalesce(max(id), 0) FROM dtask_runs")).scalar_one()
    before = procs.snapshot(roles)
    reports = _submit(system, runs, submitters)
    ids = [i for r in reports for i in r["ids"]]
    lo = min(ids)
    assert len(ids) == runs and lo > base, (len(ids), lo, base)
    count = text(
        "SELECT count(*) FILTER (WHERE state IN ('succeeded', 'failed', 'cancelled')) AS done,"
        " count(*) FILTER (WHERE state = 'succeeded') AS ok, max(finished_at) AS last"
        " FROM dtask_runs WHERE id >= :lo AND id <= :hi"
    )
    pending = text(
        "SELECT count(*) FROM dtask_runs WHERE id >= :lo AND id <= :hi"
        " AND state IN ('pending', 'splitting', 'running')"
    )
    bounds = {"lo": lo, "hi": max(ids)}
    deadline = time.monotonic() + 3600
    while True:  # the partial index on unfinished states keeps this poll cheap
        with engine.connect() as conn:
            if conn.execute(pending, bounds).scalar_one() == 0:
                row = conn.execute(count, bounds).one()
                if row.done == runs:
                    break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{runs} runs not finished after an hour")
        time.sleep(0.2)
    out = _submit_summary(reports)
    seconds = row.last.timestamp() - out["first_submit"]
    out["timeline"] = _timeline(engine, bounds, out["first_submit"])
    with engine.connect() as conn:  # the reaper re-sends a master left pending for too long
        out["masters_resent"] = conn.execute(
            text(
                "SELECT count(*) FROM dtask_runs WHERE id >= :lo AND id <= :hi"
                " AND master_sent_at IS NOT NULL"
            ),
            bounds,
        ).scalar_one()
    out.update(
        system=system,
        runs=runs,
        succeeded=row.ok,
        seconds=seconds,
        rate=runs / seconds,
        cpu=procs.cpu_by_role(before, procs.snapshot(roles)),
    )
    return out


def _timeline(engine: Any, bounds: dict[str, int], origin: float) -> dict[str, list[float]]:
    """Seconds from the first submit at which the runs were split (their master ran), their
    children started and the runs finished: [first, median, last] of each."""
    from sqlalchemy import text

    def spread(column: str, table: str, key: str) -> str:
        at = f"extract(epoch FROM {column}) - :origin"
        return (
            f"SELECT min({at}), percentile_cont(0.5) WITHIN GROUP (ORDER BY {at}), max({at})"
            f" FROM {table} WHERE {key} >= :lo AND {key} <= :hi"
        )

    queries = {
        "split": spread("started_at", "dtask_runs", "id"),
        "child_started": spread("started_at", "dtask_children", "run_id"),
        "finished": spread("finished_at", "dtask_runs", "id"),
    }
    with engine.connect() as conn:
        return {
            name: [
                round(float(v), 3)
                for v in conn.execute(text(q), {**bounds, "origin": origin}).one()
            ]
            for name, q in queries.items()
        }


def celery_small_runs(runs: int, submitters: int, roles: dict[int, str]) -> dict[str, Any]:
    """``runs`` ``raw.sleep1ms`` tasks from ``submitters`` processes with ``.delay()``; the
    raw worker must be up. Completion: every task's result is in the result backend."""
    from bench import procs
    from bench.raw_app import app

    before = procs.snapshot(roles)
    reports = _submit("celery", runs, submitters)
    keys = [app.backend.get_key_for_task(i) for r in reports for i in r["ids"]]
    client = app.backend.client
    done: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 3600
    while len(done) < len(keys):
        todo = [k for k in keys if k not in done]
        for at in range(0, len(todo), 1000):
            chunk = todo[at : at + 1000]
            done.update((k, v) for k, v in zip(chunk, client.mget(chunk), strict=True) if v)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{runs} tasks not finished after an hour")
        if len(done) < len(keys):
            time.sleep(0.2)
    metas = [json.loads(v) for v in done.values()]
    last = max(datetime.fromisoformat(m["date_done"]) for m in metas)
    if last.tzinfo is None:  # Celery writes UTC
        last = last.replace(tzinfo=UTC)
    out = _submit_summary(reports)
    seconds = last.timestamp() - out["first_submit"]
    out.update(
        system="celery",
        runs=runs,
        succeeded=sum(m["status"] == "SUCCESS" for m in metas),
        seconds=seconds,
        rate=runs / seconds,
        cpu=procs.cpu_by_role(before, procs.snapshot(roles)),
    )
    return out


# --- standalone ----------------------------------------------------------------------------


def small_runs(
    runs: int,
    submitters: int,
    concurrency: int = 2,
    system: str = "all",
    dispatch: str = "window",
    pickup: str = "1",
    statements: bool = False,
) -> dict[str, Any]:
    """A fresh cluster, then each side once (dtask, dtask's bulk submit, Celery); the ratios
    runs/s over tasks/s. ``system``: all, or one of dtask, bulk, celery. ``dispatch``:
    DTASK_DISPATCH of the dtask worker (window, as shipped, or all); ``pickup``: DTASK_PICKUP
    of the submitters. ``statements``: PostgreSQL's log of every statement while dtask's
    sides run, counted per run (the submitters' and the workers' with their background
    passes; not this harness's polls): slower, so not for the rates."""
    work = prepare_environment(
        DTASK_BENCH_RAW="stock", DTASK_DISPATCH=dispatch, DTASK_PICKUP=pickup
    )
    from bench import measure
    from dtask import services
    from dtask.services import embedded

    services.ensure_broker()
    engine = services.store().engine
    workers = Workers(work)
    result: dict[str, Any] = {
        "runs": runs,
        "submitters": submitters,
        "dispatch": dispatch,
        "pickup": pickup,
    }
    try:
        roles = {}
        sides = ("dtask", "bulk", "celery") if system == "all" else (system,)
        if "dtask" in sides or "bulk" in sides:
            proc = workers.dtask(concurrency)
            roles[proc.pid] = "dtask"
        if "celery" in sides:
            proc = workers.raw(concurrency)
            roles[proc.pid] = "raw"
        workers.ready()
        for side in ("dtask", "bulk"):
            if side in sides:
                log = services.current().settings.home / "postgres" / "log"
                if statements:
                    measure.statement_log(engine, on=True)
                offset = log.stat().st_size
                result[side] = dtask_small_runs(engine, runs, submitters, roles, side)
                _say(result[side], "runs")
                if statements:
                    time.sleep(1.5)  # the last passes' statements reach the log
                    counted = measure.count_statements(log, offset, exclude_pid=os.getpid())
                    measure.statement_log(engine, on=False)
                    result[side]["statements"] = counted
                    per_run = sum(counted.values()) / runs
                    print(f"  PostgreSQL statements per run: {per_run:.2f} ({counted})")
        if "celery" in sides:
            result["celery"] = celery_small_runs(runs, submitters, roles)
            _say(result["celery"], "tasks")
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    if "dtask" in result and "celery" in result:
        result["ratio"] = result["dtask"]["rate"] / result["celery"]["rate"]
        print(f"ratio dtask runs/s / Celery tasks/s: {result['ratio']:.2f} (target >= 1.0)")
    if "bulk" in result and "celery" in result:
        result["bulk_ratio"] = result["bulk"]["rate"] / result["celery"]["rate"]
        print(
            f"ratio submit_many runs/s / Celery tasks/s: {result['bulk_ratio']:.2f} (target >= 3)"
        )
    for side in ("dtask", "bulk", "celery"):
        if side in result:
            for key in ("calls", "ids"):
                result[side].pop(key, None)
    return result


def _say(out: dict[str, Any], unit: str) -> None:
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(out["cpu"].items()))
    print(
        f"{out['system']}: {out['runs']:,} {unit} in {out['seconds']:.1f} s"
        f" = {out['rate']:,.0f} {unit}/s ({out['succeeded']:,} succeeded);"
        f" submitting took {out['submit_seconds']:.1f} s ({out['submits_per_s']:,.0f}/s,"
        f" per call p50 {out['submit_ms_p50']:.2f} ms, p99 {out['submit_ms_p99']:.2f} ms,"
        f" {out['submitter_cpu_s']:.1f} s CPU in the submitters); CPU s: {cpu}",
        flush=True,
    )
    if "timeline" in out:  # seconds after the first submit: [first, median, last]
        spans = "; ".join(
            f"{k} {v[0]:.1f}/{v[1]:.1f}/{v[2]:.1f}" for k, v in out["timeline"].items()
        )
        print(f"  s after the first submit (first/median/last): {spans}", flush=True)
        print(f"  masters re-sent by the reaper (pending too long): {out['masters_resent']:,}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--system", choices=["all", "dtask", "bulk", "celery"], default="all")
    parser.add_argument(
        "--dispatch",
        choices=["window", "all"],
        default="window",
        help="DTASK_DISPATCH of the dtask worker (default window, as shipped)",
    )
    parser.add_argument(
        "--pickup",
        choices=["0", "1"],
        default="1",
        help="DTASK_PICKUP of the dtask submitters (default 1, as shipped)",
    )
    parser.add_argument(
        "--statements", action="store_true", help="count PostgreSQL's statements per dtask run"
    )
    parser.add_argument("--submitter", choices=["dtask", "bulk", "celery"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submitter:  # one of the submitter processes this module starts
        submitter(args.submitter, args.runs)
        return 0
    began = time.monotonic()
    result = small_runs(
        args.runs, args.submitters, args.concurrency, args.system, args.dispatch, args.pickup,
        args.statements,
    )  # fmt: skip
    print(json.dumps(result, default=str))
    if args.system == "all":
        save(result, time.monotonic() - began)
    return 0


def save(result: dict[str, Any], seconds: float) -> None:
    """bench/out/small_runs.json: what docs/benchmarks.md shows (bench/report.py)."""
    d, b, c = result["dtask"], result["bulk"], result["celery"]
    lines = [
        f"`python -m bench.small_runs`: {result['runs']:,} runs of one 1-ms child each"
        f" (`dtask.submit`, then one `dtask.submit_many` call per submitter), against stock"
        f" Celery's {result['runs']:,} 1-ms tasks (`.delay()`, every result read back),"
        f" {result['submitters']} submitting processes, 2 worker processes each:",
        "",
        "| system | completed/s | seconds | submit call p50 / p99 ms | submitters' CPU s |",
        "|:-|---:|---:|---:|---:|",
    ]
    for name, side in (
        ("dtask, `submit` (runs)", d),
        ("dtask, `submit_many` (runs)", b),
        ("stock Celery (tasks)", c),
    ):
        lines.append(
            f"| {name} | {side['rate']:,.0f} | {side['seconds']:.1f}"
            f" | {side['submit_ms_p50']:.2f} / {side['submit_ms_p99']:.2f}"
            f" | {side['submitter_cpu_s']:.1f} |"
        )
    lines += [
        "",
        f"dtask's runs/s over stock Celery's tasks/s: **{result['ratio']:.2f}** with `submit`,"
        f" **{result['bulk_ratio']:.2f}** with `submit_many`.",
    ]
    if "masters_resent" in d:
        lines[-1] += f" Masters the reaper re-sent: {d['masters_resent']:,}."
    lines += [
        "",
        "CPU per run (per task), milliseconds, by process (the harness's polling left out):",
        "",
        "| system | all | submitters | worker main | pool | PostgreSQL | Redis |",
        "|:-|---:|---:|---:|---:|---:|---:|",
    ]
    for name, side, worker in (("`submit`", d, "dtask"), ("`submit_many`", b, "dtask"),
                               ("stock Celery", c, "raw")):  # fmt: skip
        cpu, n = side["cpu"], result["runs"]
        roles = (f"{worker} main", f"{worker} pool", "postgres", "redis")
        parts = [side["submitter_cpu_s"], *(cpu.get(role, 0.0) for role in roles)]
        cells = " | ".join(f"{1000 * v / n:.2f}" for v in [sum(parts), *parts])
        lines.append(f"| {name} | {cells} |")
    out = {
        "seconds": seconds,
        "ratio": result["ratio"],
        "bulk_ratio": result["bulk_ratio"],
        "markdown": "\n".join(lines),
    }
    path = REPO / "bench" / "out" / "small_runs.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
