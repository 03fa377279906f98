"""dtask against what its users would pick instead, side by side on this machine: stock
Celery (a chord with Celery's defaults, and the same chord of ``chunks(..., 100)``, which an
expert hand-writes for tiny tasks: no record, retry or checkpoint per child), Dramatiq (a group
with a completion callback) and Procrastinate (on the same PostgreSQL; it has no fan-in, so
its client defers N jobs and waits for all of them), 2 worker processes each, N no-op children
from one submitter, the systems' runs alternating.

    .venv/bin/python -m bench.peers [--sizes 2000,10000] [--repeats 3] [--broker redis|amqp]
        [--systems dtask,celery,chunks,dramatiq,procrastinate] [--env DTASK_X=Y ...]

--broker redis (the default): every broker is the embedded Redis. --broker amqp: dtask, stock
Celery and Dramatiq send their messages through RabbitMQ (--amqp-url; by default a vhost of the
benchmark's own, made with rabbitmqctl, so purging it never touches a test's queues), while
results and fan-in counters stay on the embedded Redis; its queues are purged first.
Procrastinate has no broker: it runs on PostgreSQL either way.

Prints a Markdown table (also bench/out/peers.md): each system's median seconds and
children/s, and dtask's time as a ratio of each other system's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from bench import measure
from bench.cluster import REPO, Workers, prepare_environment

SYSTEMS = ("dtask", "celery", "chunks", "dramatiq", "procrastinate")
CHUNK = 100  # children per task of the chunks baseline
NAMES = {
    "dtask": "dtask",
    "celery": "stock Celery",
    "chunks": f"Celery chunks({CHUNK})",
    "dramatiq": "Dramatiq",
    "procrastinate": "Procrastinate",
}
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/dtask-bench"
# what the benchmark's systems declare in RabbitMQ: dtask's queue and its tiers' queues, raw
# Celery's, and Dramatiq's (bench.dramatiq_app.QUEUES)
AMQP_QUEUES = ("dtask", "dtask.regular", "dtask.premium", "raw", "default", "default.DQ",
               "default.XQ")  # fmt: skip
OUT = REPO / "bench" / "out" / "peers.md"
# dtask's children run since the counters were read, and per table their row writes
WRITES: dict[str, float] = {}


def client(module: str, n: int, *extra: str) -> float:
    out = subprocess.run(
        [sys.executable, "-m", module, str(n), *extra],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=3600,
    )  # fmt: skip
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    if measured.get("workers", 2) < 2:  # Procrastinate's client says which processes ran them
        print(f"  {module} N={n:,}: only {measured['workers']} worker process ran the jobs")
    return float(measured["seconds"])


def one(
    system: str, n: int, engine: Any, roles: dict[int, str], by_role: dict[str, float] | None = None
) -> tuple[float, float]:
    """(seconds, CPU seconds of every process of the cluster: workers, their pools, Redis,
    PostgreSQL, the submitting client) for one run of N children; ``by_role`` gets the CPU
    seconds per role ("dtask main", "dtask pool", "postgres", "bench" for this process and
    its clients...)."""
    before, clients = cluster_cpu(roles), _children_cpu()
    if system == "dtask":
        took = measure.dtask_fanout(engine, n, {}).seconds
        WRITES["children"] = WRITES.get("children", 0) + n
    elif system == "celery":
        took = measure.raw_fanout(n, {}).seconds
    elif system == "chunks":  # on stock Celery's workers
        took = client("bench.raw_client", n, "--chunks", str(CHUNK))
    else:
        took = client(f"bench.{system}_client", n)
    after = cluster_cpu(roles)
    spent = _children_cpu() - clients
    for pid, (role, cpu) in after.items():
        used = cpu - before.get(pid, (role, 0.0))[1]
        spent += used
        if by_role is not None:
            by_role[role] = by_role.get(role, 0.0) + used
    if by_role is not None:
        by_role["bench"] = by_role.get("bench", 0.0) + _children_cpu() - clients
    return took, spent


def cluster_cpu(roots: dict[int, str]) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds) of this process and of every process under ``roots`` (the
    workers, the embedded PostgreSQL and Redis): nothing else on the machine is counted. A
    worker's own process is "<role> main", the processes under it "<role> pool"."""
    import psutil

    found = {os.getpid(): ("bench", psutil.Process())}
    for pid, role in roots.items():
        try:
            root = psutil.Process(pid)
            under = root.children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        worker = role not in ("postgres", "redis")
        found[pid] = (f"{role} main" if worker else role, root)
        found.update((p.pid, (f"{role} pool" if worker else role, p)) for p in under)
    out = {}
    for pid, (role, proc) in found.items():
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        own = t.user + t.system
        out[pid] = (role, own + (t.children_user + t.children_system if pid != os.getpid() else 0))
    return out


def services_pids(home: Any) -> dict[int, str]:
    """The embedded PostgreSQL's postmaster and Redis server under ``home``."""
    found = {}
    for role, pidfile in (("postgres", home / "postgres" / "postmaster.pid"),
                          ("redis", home / "redis" / "redis.pid")):  # fmt: skip
        try:
            found[int(pidfile.read_text().split()[0])] = role
        except (OSError, ValueError, IndexError):
            print(f"bench.peers: no {role} pid in {pidfile}: its CPU is not counted")
    return found


def _children_cpu() -> float:
    """CPU of this process's finished subprocesses (the clients, gone before a snapshot)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big", type=int, default=100_000, help="sizes from here run once")
    parser.add_argument(
        "--big-systems",
        default="dtask,chunks",
        help="the systems that run at the big sizes: stock Celery and Dramatiq took 239 s and"
        " 220 s at 100,000 here, most of make bench's time, and their 10,000 places them",
    )
    parser.add_argument(
        "--once-systems",
        default="procrastinate",
        help="the systems that run once at every size, not --repeats times (Procrastinate's"
        " 10k takes 25-60 s here: one run places it, three would cost make bench minutes)",
    )
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis")
    parser.add_argument("--amqp-url", default=AMQP_URL)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for dtask's workers and client"
    )
    args = parser.parse_args()
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        parser.error(f"--systems: unknown {', '.join(unknown) or '(none)'}; from {SYSTEMS}")
    if args.broker == "amqp":
        problem = amqp_ready(args.amqp_url)
        if problem is not None:
            print(
                f"bench.peers: RabbitMQ at {_where(args.amqp_url)} not usable: {problem}",
                file=sys.stderr,
            )
            return 2
    began = time.monotonic()
    work = prepare_environment(DTASK_BENCH_RAW="stock", **dict(e.split("=", 1) for e in args.env))
    from dtask import services
    from dtask.services import embedded

    home = work / "home"
    if args.broker == "amqp":  # all three named: dtask refuses a mix of embedded and given
        os.environ.update(
            DTASK_DATABASE_URL=embedded.postgres_url(home),
            DTASK_RESULT_BACKEND=embedded.ensure_redis(home),
            DTASK_BROKER_URL=args.amqp_url,
            DTASK_AUTO_MIGRATE="1",
            DTASK_BENCH_AMQP_URL=args.amqp_url,
        )
    resolved = services.ensure_broker()
    os.environ["DTASK_BENCH_REDIS_SOCKET"] = str(embedded.redis_socket(resolved.settings.home))
    engine = services.store().engine
    workers = Workers(work)
    seconds: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    roles_cpu: dict[tuple[str, int], list[dict[str, float]]] = {}
    big_systems = set(args.big_systems.split(","))
    once_systems = set(args.once_systems.split(","))
    try:
        roles = start_workers(workers, systems, resolved.database_url)
        roles.update(services_pids(resolved.settings.home))
        for system in systems:  # warm-up: imports, connections, queues
            one(system, 100, engine, roles)
        rows = measure.row_writes(engine) if "dtask" in systems else {}
        WRITES.clear()
        for n in [int(s) for s in args.sizes.split(",")]:
            big = n >= args.big
            chosen = tuple(s for s in systems if not big or s in big_systems)
            for rep in range(1 if big else args.repeats):
                turn = rep % len(chosen)
                for system in chosen[turn:] + chosen[:turn]:
                    if rep and system in once_systems:
                        continue
                    by_role: dict[str, float] = {}
                    took, used = one(system, n, engine, roles, by_role)
                    seconds.setdefault((system, n), []).append(took)
                    cpu.setdefault((system, n), []).append(used)
                    roles_cpu.setdefault((system, n), []).append(by_role)
                    shares = ", ".join(
                        f"{role} {value / n * 1000:.2f}"
                        for role, value in sorted(by_role.items(), key=lambda kv: -kv[1])
                        if value / n * 1000 >= 0.01
                    )
                    print(
                        f"{system} N={n:,}: {took:.1f} s ({n / took:,.0f}/s),"
                        f" {used / n * 1000:.2f} ms CPU per child ({shares})",
                        flush=True,
                    )
        if WRITES:
            per = measure.writes_per_child(rows, measure.row_writes(engine), WRITES["children"])
            WRITES.update(per)
            print(f"dtask: row writes per child {per}", flush=True)
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(home)
    table = _table(seconds, cpu, broker_line(args.broker, args.amqp_url, systems))
    out = OUT if args.broker == "redis" else OUT.with_name("peers-amqp.md")
    out.parent.mkdir(exist_ok=True)
    out.write_text(table + "\n")
    measured = [
        {
            "system": s,
            "n": n,
            "seconds": seconds[(s, n)],
            "cpu": cpu[(s, n)],
            "cpu_by_role": roles_cpu[(s, n)],
        }
        for s, n in seconds
    ]
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "broker": args.broker,
                "runs": measured,
                "big": args.big,
                "repeats": args.repeats,
                "once": sorted(once_systems & set(systems)),
                "seconds": time.monotonic() - began,
            }
        )
    )
    print(table)
    return 0


def start_workers(workers: Workers, systems: tuple[str, ...], database_url: str) -> dict[int, str]:
    """Each chosen system's 2 worker processes (one child at a time each); their pids (whose
    process trees' CPU is counted)."""
    roles: dict[int, str] = {}
    if "dtask" in systems:
        proc = workers.dtask(2)
        workers.ready(proc)
        roles[proc.pid] = "dtask"
    if "celery" in systems or "chunks" in systems:
        roles[workers.raw(2).pid] = "celery"
    if "dramatiq" in systems:
        argv = [sys.executable, "-m", "dramatiq", "bench.dramatiq_app",
                "--processes", "2", "--threads", "1"]  # fmt: skip
        proc = workers._spawn(argv, "dramatiq")
        workers.quiet.add(proc.pid)
        roles[proc.pid] = "dramatiq"
    if "procrastinate" in systems:
        from bench.procrastinate_app import create_database

        dsn = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        os.environ["DTASK_BENCH_PROCRASTINATE_DSN"] = create_database(dsn)
        # at WARNING, as stock Celery's worker here: at its default (INFO) it logs every job
        argv = [sys.executable, "-m", "procrastinate", "--app", "bench.procrastinate_app.app",
                "--log-level", "warning", "worker", "--concurrency", "1"]  # fmt: skip
        for _ in range(2):
            proc = workers._spawn(argv, "procrastinate")
            workers.quiet.add(proc.pid)
            roles[proc.pid] = "procrastinate"
    return roles


def amqp_ready(url: str) -> str | None:
    """Why RabbitMQ at ``url`` cannot be used, if it cannot; else purge the benchmark's
    queues there (so no leftover from an earlier run is counted) and return None."""
    from kombu import Connection

    vhost = urlsplit(url).path[1:] or "/"
    if url == AMQP_URL and shutil.which("rabbitmqctl"):  # the benchmark's own vhost
        for argv in (
            ["add_vhost", vhost],
            ["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"],
        ):
            subprocess.run(["rabbitmqctl", *argv], capture_output=True, timeout=60, check=False)
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
            for name in AMQP_QUEUES:
                channel = conn.channel()
                try:
                    purged = channel.queue_purge(name)
                    if purged:
                        print(f"purged {purged} leftover messages from {name!r} ({vhost})")
                except conn.channel_errors:  # no such queue (the broker closes the channel)
                    pass
                finally:
                    channel.close()
    except Exception as exc:  # kombu and amqp raise many kinds: say what it was
        return f"{type(exc).__name__}: {exc}"
    return None


def broker_line(broker: str, amqp_url: str, systems: tuple[str, ...]) -> str:
    brokered = [NAMES[s] for s in SYSTEMS if s in systems and s != "procrastinate"]
    if not brokered:
        return "no broker"
    if broker == "redis":
        return "broker: the embedded Redis (results and fan-in counters too)"
    return (
        f"broker: RabbitMQ ({_where(amqp_url)}) for"
        f" {', '.join(brokered[:-1])}{' and ' if len(brokered) > 1 else ''}{brokered[-1]};"
        " results and fan-in counters on the embedded Redis"
    )


def _where(amqp_url: str) -> str:
    """host:port/vhost, without the credentials."""
    url = urlsplit(amqp_url)
    return f"{url.hostname}:{url.port or 5672}{url.path or '/'}"


def _table(
    seconds: dict[tuple[str, int], list[float]],
    cpu: dict[tuple[str, int], list[float]],
    broker: str,
) -> str:
    ran = [s for s in SYSTEMS if any(system == s for system, _ in seconds)]
    others = [s for s in ran if s != "dtask"] if "dtask" in ran else []
    lines = [
        f"`python -m bench.peers` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},"
        f" {broker}{' (Procrastinate: PostgreSQL only)' if 'procrastinate' in ran else ''}:"
        " median seconds (children/s) of each system's runs"
        + (", and dtask's time over each." if others else "."),
        "",
        "| N | "
        + " | ".join([NAMES[s] for s in ran] + [f"dtask / {NAMES[s]}" for s in others])
        + " |",
        "|---:" * (1 + len(ran) + len(others)) + "|",
    ]
    for n in sorted({n for _, n in seconds}):
        med = {s: statistics.median(seconds[(s, n)]) for s in ran if (s, n) in seconds}
        cells = [f"{med[s]:.1f} s ({n / med[s]:,.0f}/s)" if s in med else "-" for s in ran]
        ratios = [
            f"{med['dtask'] / med[s]:.2f}x" if "dtask" in med and s in med else "-" for s in others
        ]
        lines.append(f"| {n:,} | " + " | ".join(cells + ratios) + " |")
    lines += [
        "",
        "CPU per child, milliseconds, median of the runs (every process of the cluster: the"
        " system's workers and their pools, Redis, PostgreSQL, the submitting client):",
        "",
        "| N | " + " | ".join(NAMES[s] for s in ran) + " |",
        "|---:" * (1 + len(ran)) + "|",
    ]
    for n in sorted({n for _, n in cpu}):
        per = [
            f"{statistics.median(cpu[(s, n)]) / n * 1000:.2f}" if (s, n) in cpu else "-"
            for s in ran
        ]
        lines.append(f"| {n:,} | " + " | ".join(per) + " |")
    if WRITES:
        tables = [t for t in WRITES if t != "children"]
        lines += [
            "",
            "dtask's PostgreSQL row writes per child, over all its runs above (inserted, updated"
            " and deleted rows in pg_stat_user_tables):",
            "",
            "| " + " | ".join(tables) + " |",
            "|---:" * len(tables) + "|",
            "| " + " | ".join(f"{WRITES[t]:.2f}" for t in tables) + " |",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
