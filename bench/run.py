"""`make bench`'s last step (after bench.peers, bench.small_runs and bench.busy_latency): cost
per child against stock Celery, latency on an idle cluster, a profile, failover/drain and the
scale curve. Writes bench/out/results.json, then docs/benchmarks.md and its plots from
everything in bench/out/.

    make bench                                    # the whole thing, ~10 min here
    python -m bench.run --quick                   # tiny sizes, to try the harness
    python -m bench.run --fanout-only --sizes 100000 --raw-big   # raw Celery vs dtask pairs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment

OUT = REPO / "bench" / "out"


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=3, help="alternating pairs per size")
    parser.add_argument("--big", type=int, default=100_000, help="sizes from here run once")
    parser.add_argument(
        "--raw-big", action="store_true", help="also run raw Celery at the big size (~8 min)"
    )
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--cost-n", type=int, default=10_000)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--drains", type=int, default=3)
    parser.add_argument("--scale-n", type=int, default=1000)
    parser.add_argument("--profile-n", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to try the harness")
    parser.add_argument(
        "--baseline",
        choices=["dtask-settings", "stock"],
        default="stock",
        help="raw Celery with Celery's defaults as users run it, or with dtask's settings",
    )
    parser.add_argument(
        "--dispatch",
        choices=["all", "window"],
        default="window",
        help="DTASK_DISPATCH of the dtask workers (default window, as shipped)",
    )
    parser.add_argument(
        "--fanout",
        action="store_true",
        help="also the alternating dtask/raw fan-out pairs (bench.peers measures fan-out)",
    )
    parser.add_argument(
        "--fanout-only",
        action="store_true",
        help="only the fan-out runs, saved to bench/out/fanout-only.json; docs/benchmarks.md"
        " (e.g. --sizes 100000 --raw-big)",
    )
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.big, args.repeats = "200,1000", 1000, 1
        args.cost_n, args.latency, args.kills, args.drains = 200, 20, 1, 1
        args.scale_n, args.profile_n = 300, 500
    return args


class Clock:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.start:6.0f} s] {message}", flush=True)


def main() -> int:
    args = _args()
    extra = {"DTASK_BENCH_RAW": "stock"} if args.baseline == "stock" else {}
    work = prepare_environment(DTASK_DISPATCH=args.dispatch, **extra)
    from dtask import services
    from dtask.services import embedded

    engine = services.store().engine
    workers = Workers(work)
    clock = Clock()
    results: dict[str, Any] = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M UTC")}
    try:
        clock.say(f"embedded services up in {work}; workers starting")
        if args.fanout_only:
            return fanout_only(args, engine, workers, results, clock)
        fanout_phase(args, engine, workers, results, clock)
        scale_phase(args, engine, workers, results, clock)
        clock.say("failover and drain: 3 one-process dtask workers")
        from bench.measure import failover_and_drain

        results["failover"] = failover_and_drain(engine, workers, args.kills, args.drains)
    finally:
        workers.stop_all()
        embedded.stop(Path(os.environ["DTASK_HOME"]))
    results["seconds"] = time.monotonic() - clock.start
    OUT.mkdir(exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    from bench import report

    report.write(results)
    clock.say(f"done: docs/benchmarks.md written; whole run {results['seconds']:.0f} s")
    return 0


def fanout_only(
    args: argparse.Namespace, engine: Any, workers: Workers, results: dict[str, Any], clock: Clock
) -> int:
    fanout_runs(args, engine, _start(workers, args.concurrency), results, clock)
    results["seconds"] = time.monotonic() - clock.start
    OUT.mkdir(exist_ok=True)
    (OUT / "fanout-only.json").write_text(json.dumps(results, indent=1, default=str))
    for n, ratio in _median_ratios(results["fanout"]).items():
        clock.say(f"N={n:,}: dtask takes {ratio:.2f}x raw Celery's time (median of pairs)")
    clock.say(f"done in {results['seconds']:.0f} s: bench/out/fanout-only.json")
    return 0


def _median_ratios(runs: list[dict[str, Any]]) -> dict[int, float]:
    """dtask's seconds over raw's, per N, each dtask run paired with the raw run beside it."""
    ratios: dict[int, list[float]] = {}
    for n in sorted({r["n"] for r in runs}):
        dtask = [r["seconds"] for r in runs if r["n"] == n and r["system"] == "dtask"]
        raw = [r["seconds"] for r in runs if r["n"] == n and r["system"] == "raw"]
        if dtask and raw:
            ratios[n] = [d / r for d, r in zip(dtask, raw, strict=False)]
    return {n: statistics.median(values) for n, values in ratios.items()}


def _start(workers: Workers, concurrency: int) -> dict[int, str]:
    dtask_worker, raw_worker = workers.dtask(concurrency), workers.raw(concurrency)
    workers.ready(dtask_worker, raw_worker)
    return {dtask_worker.pid: "dtask", raw_worker.pid: "raw"}


def fanout_phase(
    args: argparse.Namespace, engine: Any, workers: Workers, results: dict[str, Any], clock: Clock
) -> None:
    from bench import measure

    roles = _start(workers, args.concurrency)
    if args.fanout:
        fanout_runs(args, engine, roles, results, clock)
    clock.say(f"cost per child: one counted run each at N={args.cost_n}")
    results["cost"] = cost_per_child(args.cost_n, engine, roles)
    clock.say(f"latency: {args.latency} one-child runs, one at a time")
    results["latency"] = measure.latency(engine, args.latency)
    clock.say(f"profile: py-spy on the dtask worker during N={args.profile_n}")
    results["profile"] = profile(engine, roles, args.profile_n)
    workers.stop_all()


def fanout_runs(
    args: argparse.Namespace,
    engine: Any,
    roles: dict[int, str],
    results: dict[str, Any],
    clock: Clock,
) -> None:
    from bench import measure

    measure.dtask_fanout(engine, 100, roles)  # warm-up: imports, connections, queues
    measure.raw_fanout(100, roles)
    runs: list[dict[str, Any]] = []
    for n in [int(s) for s in args.sizes.split(",")]:
        big = n >= args.big
        for rep in range(1 if big else args.repeats):
            order = ["raw", "dtask"] if rep % 2 == 0 else ["dtask", "raw"]
            for system in order:
                if system == "raw" and big and not args.raw_big:
                    continue
                clock.say(f"fan-out {system} N={n} (run {rep + 1})")
                if system == "dtask":
                    one = measure.dtask_fanout(engine, n, roles, rss=big)
                else:
                    one = measure.raw_fanout(n, roles, rss=big)
                clock.say(f"  {one.seconds:.1f} s, {one.rate:.0f} children/s")
                runs.append(dataclasses.asdict(one))
    results["fanout"] = runs


def cost_per_child(n: int, engine: Any, roles: dict[int, str]) -> dict[str, Any]:
    from bench import measure
    from dtask import services

    client = measure.redis_client()
    log = services.current().settings.home / "postgres" / "log"
    out: dict[str, Any] = {"n": n}
    measure.statement_log(engine, on=True)
    try:
        for system in ("raw", "dtask"):
            client.config_resetstat()
            offset = log.stat().st_size
            if system == "dtask":
                measure.dtask_fanout(engine, n, roles)
            else:
                measure.raw_fanout(n, roles)
            time.sleep(1.5)  # let the reaper's passes and events settle into the counts
            calls, wire = measure.redis_counters(client)
            statements = measure.count_statements(log, offset, exclude_pid=os.getpid())
            out[system] = {"redis_commands": calls, "redis_bytes": wire, "pg": statements}
    finally:
        measure.statement_log(engine, on=False)
    return out


def profile(engine: Any, roles: dict[int, str], n: int) -> dict[str, Any]:
    from bench import collapse, measure

    pid = next(p for p, r in roles.items() if r == "dtask")
    path = OUT / "profile-dtask.txt"
    OUT.mkdir(exist_ok=True)
    spy = str(Path(sys.executable).with_name("py-spy"))
    command = [spy, "record", "-p", str(pid), "--subprocesses", "-r", "100", "-f", "raw",
               "-o", str(path)]  # fmt: skip
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        run = measure.dtask_fanout(engine, n, roles)
    finally:
        recorder.send_signal(2)
        recorder.wait(60)
    return {
        "command": " ".join([*command[:-2], "-o", "bench/out/profile-dtask.txt"]),
        "n": n,
        "seconds": run.seconds,
        "summary": collapse.summarise_roles(str(path), roles),
    }


def scale_phase(
    args: argparse.Namespace, engine: Any, workers: Workers, results: dict[str, Any], clock: Clock
) -> None:
    from bench import measure

    curve = []
    for concurrency in (1, 2, 4):
        roles = _start(workers, concurrency)
        for system in ("raw", "dtask") if concurrency % 4 else ("dtask", "raw"):
            clock.say(f"scale: {system} with {concurrency} worker process(es), N={args.scale_n}")
            if system == "dtask":
                one = measure.dtask_fanout(engine, args.scale_n, roles)
            else:
                one = measure.raw_fanout(args.scale_n, roles)
            clock.say(f"  {one.rate:.0f} children/s")
            curve.append({"concurrency": concurrency, **dataclasses.asdict(one)})
        workers.stop_all()
    results["scale"] = curve


if __name__ == "__main__":
    sys.exit(main())
