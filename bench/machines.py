"""Many machines on one box: at least 16 `dtask worker` processes against one stock
PostgreSQL (max_connections 100, pg_stat_statements on), I/O-bound children (each sleeps
0.5 s) from several clients, and a quarter of the workers SIGKILLed at once mid-run.

    .venv/bin/python -m bench.machines                       # 16 x -P threads -c 4, direct
    .venv/bin/python -m bench.machines --profile pgbouncer   # 16 x -P threads -c 16, PgBouncer

Reports slot utilization while work waits, peak PostgreSQL connections, PostgreSQL CPU per
child, the loops' passes (from each worker's summary at shutdown), the statements per second
of the registry, the advisory-lock turns and the monitor (pg_stat_statements), and failover:
how long the killed workers' children took to run again, and that every child succeeded once.
Writes bench/out/machines-<profile>.md and .json (make cluster plots them)."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil

from bench.cluster import REPO, Workers, prepare_environment

OUT = REPO / "bench" / "out"
LOOP_LINE = re.compile(
    r"(\w+) loop: (\d+) passes, (\d+) not refused the turn, ([\d.]+) ms each, ([\d.]+) ms"
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", choices=["direct", "pgbouncer"], default="direct")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=None, help="4 direct, 16 pgbouncer")
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork"])
    parser.add_argument("--children", type=int, default=None, help="slots x 40 by default")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.5)
    parser.add_argument("--server-connections", type=int, default=40, help="PgBouncer's pool")
    args = parser.parse_args()
    concurrency = args.concurrency or (4 if args.profile == "direct" else 16)
    slots = args.workers * concurrency
    total = args.children or slots * 40

    from bench import postgres

    work = prepare_environment()
    server_url = postgres.start(max_connections=100)
    with ExitStack() as stack:
        url = server_url
        if args.profile == "pgbouncer":
            from tests.support.pgbouncer import pgbouncer

            url = stack.enter_context(
                pgbouncer(server_url, server_connections=args.server_connections)
            )
        from dtask.services import embedded

        redis = embedded.ensure_redis(work / "home")  # the broker: the embedded Redis
        os.environ.update(
            DTASK_DATABASE_URL=url, DTASK_BROKER_URL=redis, DTASK_RESULT_BACKEND=redis
        )
        stack.callback(embedded.stop, work / "home")
        result = measure(args, work, url, server_url, concurrency, slots, total)
    OUT.mkdir(exist_ok=True)
    name = f"machines-{args.profile}"
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    table = report(result)
    (OUT / f"{name}.md").write_text(table + "\n")
    print(table)
    return 0


def measure(
    args: argparse.Namespace,
    work: Path,
    url: str,
    server_url: str,
    concurrency: int,
    slots: int,
    total: int,
) -> dict[str, Any]:
    from sqlalchemy import text

    import dtask
    from dtask import services
    from dtask.db import Limits, engine_for
    from dtask.domain.clients import Client

    dtask_bin = str(Path(sys.executable).with_name("dtask"))
    migrated = subprocess.run([dtask_bin, "migrate"], capture_output=True, text=True)
    assert migrated.returncode == 0, migrated.stderr
    server = engine_for(server_url, Limits(connections=2, pooler="none"))  # straight, to watch
    with server.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    store = services.store()
    clients = [f"client-{i}" for i in range(args.clients)]
    for name in clients:
        store.clients.save(Client(name))

    workers = Workers(work)
    procs = []
    started_at = time.monotonic()
    for i in range(args.workers):
        procs.append(workers.dtask(concurrency, f"m{i}@%h", "-P", args.pool))
    workers.ready(timeout=300)
    ready_after = time.monotonic() - started_at
    print(f"{args.workers} workers ({slots} slots) ready after {ready_after:.1f} s", flush=True)

    with server.begin() as conn:
        conn.execute(text("SELECT pg_stat_statements_reset()"))
    postmaster = postmaster_of(server)
    cpu_before = pg_cpu(postmaster)
    workers_before = sum(tree_cpu(p.pid) for p in procs)
    redis_before = tree_cpu(redis_pid())

    peak = {"connections": 0}
    seen: dict[int, float] = {}  # child id -> when first seen running again (failover)
    stop = threading.Event()
    watch: dict[str, Any] = {"interrupted": set(), "killed_at": None}

    def sample() -> None:
        while not stop.is_set():
            with server.begin() as conn:
                n = conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    )
                ).scalar()
                peak["connections"] = max(peak["connections"], int(n or 0))
                if watch["interrupted"]:
                    rows = conn.execute(
                        text("SELECT id, state, owner FROM dtask_children WHERE id = ANY(:ids)"),
                        {"ids": list(watch["interrupted"] - set(seen))},
                    ).all()
                    for row in rows:
                        again = row.state == "succeeded" or (
                            row.state == "running" and row.owner not in watch["owners"]
                        )
                        if again:
                            seen[row.id] = time.monotonic()
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    per_run = max(1, total // (args.clients * 2))
    submitted = time.monotonic()
    runs = []
    for i in range(args.clients * 2):
        client = clients[i % len(clients)]
        runs.append(dtask.submit("bench_sleep", {"n": per_run, "delay": args.sleep}, client=client))
    total = per_run * len(runs)
    ids = [r.id for r in runs]

    def succeeded() -> int:
        with server.begin() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM dtask_children"
                        " WHERE run_id = ANY(:ids) AND state = 'succeeded'"
                    ),
                    {"ids": ids},
                ).scalar()
                or 0
            )

    while succeeded() < total * 0.4:
        time.sleep(0.2)
    victims = procs[: args.workers // 4]
    victim_pids = {p.pid for p in victims} | {
        c.pid for p in victims for c in psutil.Process(p.pid).children(recursive=True)
    }
    with server.begin() as conn:
        running = conn.execute(
            text(
                "SELECT id, owner FROM dtask_children WHERE run_id = ANY(:ids)"
                " AND state = 'running'"
            ),
            {"ids": ids},
        ).all()
    owned = [(r.id, r.owner) for r in running if owner_pid(r.owner) in victim_pids]
    victims_cpu = sum(tree_cpu(p.pid) for p in victims)
    killed_at = time.monotonic()
    for proc in victims:
        os.killpg(proc.pid, signal.SIGKILL)
    for proc in victims:
        proc.wait(30)
        workers.forget(proc)
    watch["owners"] = {o for _, o in owned}
    watch["interrupted"] = {i for i, _ in owned}
    print(f"killed {len(victims)} workers holding {len(owned)} children", flush=True)

    for run in runs:
        status = run.wait(timeout=1800)
        assert status.state is dtask.RunState.SUCCEEDED, status.error
    finished = time.monotonic()
    time.sleep(0.5)
    stop.set()
    sampler.join()
    cpu_after = pg_cpu(postmaster)
    workers_after = victims_cpu + sum(tree_cpu(p.pid) for p in procs if p not in victims)
    redis_after = tree_cpu(redis_pid())

    with server.begin() as conn:
        starts = [
            float(t)
            for t in conn.execute(
                text(
                    "SELECT extract(epoch FROM started_at) FROM dtask_children"
                    " WHERE run_id = ANY(:ids) ORDER BY started_at"
                ),
                {"ids": ids},
            ).scalars()
        ]
        attempts = dict(
            conn.execute(
                text(
                    "SELECT attempt, count(*) FROM dtask_children WHERE run_id = ANY(:ids)"
                    " GROUP BY attempt"
                ),
                {"ids": ids},
            ).all()
        )
        done = succeeded()
        statements = conn.execute(
            text("SELECT query, calls, total_exec_time FROM pg_stat_statements ORDER BY calls DESC")
        ).all()
        clock = conn.execute(text("SELECT extract(epoch FROM now())")).scalar()
    wall = finished - submitted
    offset = float(clock) - time.time()  # PostgreSQL's clock against ours
    killed_epoch = time.time() - (time.monotonic() - killed_at) + offset
    before_kill = [t for t in starts if t < killed_epoch]
    # utilization while work waited, before the kill: from the first start (plus one child
    # time, the slots filling up) to the kill
    if len(before_kill) > 2:
        window_start = before_kill[0] + args.sleep
        window = [t for t in before_kill if t >= window_start]
        span = max(killed_epoch - window_start, 1e-9)
        rate = len(window) / span
    else:
        rate = 0.0
    ideal = slots / args.sleep
    submitted_epoch = time.time() - (time.monotonic() - submitted) + offset
    per_second: dict[int, int] = {}
    for t in starts:
        per_second[int(t - submitted_epoch)] = per_second.get(int(t - submitted_epoch), 0) + 1
    resumed = sorted(seen[i] - killed_at for i in watch["interrupted"] if i in seen)

    for proc in list(workers.procs):
        workers.stop(proc)
    loops: dict[str, list[tuple[int, int, float, float]]] = {}
    for path in work.glob("dtask-*.log"):
        for m in LOOP_LINE.finditer(path.read_text(errors="replace")):
            loops.setdefault(m[1], []).append((int(m[2]), int(m[3]), float(m[4]), float(m[5])))

    def rate_of(pattern: str) -> float:
        calls = sum(int(s.calls) for s in statements if re.search(pattern, s.query))
        return calls / wall

    return {
        "profile": args.profile,
        "workers": args.workers,
        "pool": args.pool,
        "concurrency": concurrency,
        "slots": slots,
        "children": total,
        "clients": args.clients,
        "child_seconds": args.sleep,
        "wall": wall,
        "started_per_second": rate,
        "ideal_per_second": ideal,
        "utilization": rate / ideal,
        "peak_connections": peak["connections"],
        "pg_cpu_ms_per_child": 1000 * (cpu_after - cpu_before) / total,
        "worker_cpu_ms_per_child": 1000 * (workers_after - workers_before) / total,
        "redis_cpu_ms_per_child": 1000 * (redis_after - redis_before) / total,
        "succeeded": done,
        "attempts": {str(k): v for k, v in attempts.items()},
        "killed_workers": len(victims),
        "interrupted": len(watch["interrupted"]),
        "resumed": len(resumed),
        "resume_p50": statistics.median(resumed) if resumed else None,
        "resume_max": max(resumed) if resumed else None,
        "loops": {
            name: {
                "workers": len(rows),
                "passes_per_second": sum(r[0] for r in rows) / wall,
                "turns_per_second": sum(r[1] for r in rows) / wall,
                "pass_ms": statistics.mean(r[2] for r in rows if r[1])
                if any(r[1] for r in rows)
                else 0.0,
                "pass_ms_max": max(r[3] for r in rows),
            }
            for name, rows in loops.items()
        },
        "statements_per_second": {
            "all": sum(int(s.calls) for s in statements) / wall,
            "registry (INSERT INTO dtask_workers)": rate_of(r"INSERT INTO dtask_workers"),
            "turn attempts (dispatcher, reaper)": rate_of(
                r"pg_try_advisory_xact_lock\(\$1, \$2\)"
            ),
            "monitor turn attempts": rate_of(r"pg_try_advisory_xact_lock\(\$1\)\s*$"),
        },
        "ready_after": ready_after,
        "started_each_second": [per_second.get(i, 0) for i in range(int(wall) + 1)],
        "killed_at_s": killed_at - submitted,
    }


def owner_pid(owner: str | None) -> int:
    """An owner is ``<hostname>:<pid>``: the pid, or 0."""
    try:
        return int(str(owner).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live children (0 when it is gone)."""
    try:
        proc = psutil.Process(pid)
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total
    except psutil.NoSuchProcess:
        return 0.0


def redis_pid() -> int:
    """The embedded Redis of this benchmark's DTASK_HOME (its socket is under it)."""
    home = os.environ["DTASK_HOME"]
    for proc in psutil.process_iter(["name", "cmdline"]):
        if "redis-server" in (proc.info["name"] or "") and home in " ".join(
            proc.info["cmdline"] or []
        ):
            return int(proc.pid)
    return 0


def postmaster_of(engine: Any) -> psutil.Process:
    from sqlalchemy import text

    with engine.begin() as conn:
        backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar())
    return psutil.Process(backend).parent()


def pg_cpu(postmaster: psutil.Process) -> float:
    """CPU seconds of the server: the postmaster, its live processes, and those it reaped."""
    times = postmaster.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in postmaster.children():
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def report(r: dict[str, Any]) -> str:
    lines = [
        f"### {r['profile']}: {r['workers']} workers x -P {r['pool']} -c {r['concurrency']}"
        f" = {r['slots']} slots, {r['children']:,} children of {r['child_seconds']} s from"
        f" {r['clients']} clients",
        "",
        "| measure | value |",
        "|---|---|",
        f"| slot utilization while work waited | {100 * r['utilization']:.0f} % ({r['started_per_second']:.0f} children started/s of {r['ideal_per_second']:.0f}) |",
        f"| peak PostgreSQL connections (server side) | {r['peak_connections']} |",
        f"| CPU per child: PostgreSQL, workers (all processes), Redis | {r['pg_cpu_ms_per_child']:.2f} ms, {r['worker_cpu_ms_per_child']:.2f} ms, {r['redis_cpu_ms_per_child']:.2f} ms |",
        f"| statements per second, all | {r['statements_per_second']['all']:.0f} |",
    ]
    for name, value in r["statements_per_second"].items():
        if name != "all":
            lines.append(f"| statements per second, {name} | {value:.1f} |")
    for name, loop in sorted(r["loops"].items()):
        lines.append(
            f"| {name} loop | {loop['passes_per_second']:.1f} passes/s over {loop['workers']}"
            f" workers, {loop['turns_per_second']:.1f} not refused the turn, {loop['pass_ms']:.1f} ms"
            f" each ({loop['pass_ms_max']:.0f} ms at most) |"
        )
    resume = (
        f"{r['resumed']} of {r['interrupted']} resumed, p50 {r['resume_p50']:.1f} s,"
        f" max {r['resume_max']:.1f} s after the kill"
        if r["resume_p50"] is not None
        else f"{r['resumed']} of {r['interrupted']} resumed"
    )
    lines += [
        f"| failover: {r['killed_workers']} workers SIGKILLed at once | {resume} |",
        f"| every child | {r['succeeded']:,} of {r['children']:,} succeeded; attempts {r['attempts']} |",
        f"| wall | {r['wall']:.1f} s (workers ready after {r['ready_after']:.1f} s) |",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
