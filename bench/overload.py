"""No collapse under overload: submits arrive at ``--factor`` times what the workers finish,
for ``--seconds``, with the backlog capped (DTASK_MAX_BACKLOG) at ``--backlog`` seconds of
that capacity. Measures completions per 5 s window against the capacity, the backlog over
time, how long it takes to drain, and every submit's latency and outcome (created or busy).

    python -m bench.overload [--seconds 60] [--factor 2] [--submitters 4] [--backlog 10]

The capacity is measured first on the same workers: the submitters submit one-child runs
(``bench_one``, a 1-ms child, or ``bench_sleep`` for ``--child-ms``) as fast as they can for
8 s (2 s for children of 4 ms or more) while the workers are frozen, then the workers drain
them alone: completions per second between the 10th and the 90th percentile of their finish
times. The submitters run with DTASK_PICKUP=1, as shipped, unless ``--pickup 0``. Each
submitter is open-loop: its submit i is due at start + i / rate, and a late one goes at once
(its latency is the call's own). Writes bench/out/overload.json and
docs/benchmarks/overload.png (``overload-50ms.*`` for ``--child-ms 50``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment

OUT = REPO / "bench" / "out"
WINDOW = 5.0  # seconds per goodput window
UNFINISHED = "state IN ('waiting', 'pending', 'splitting', 'running')"


def _run_of(child_ms: float) -> tuple[str, dict[str, Any]]:
    """The template and variables of a one-child run of ``child_ms``."""
    if child_ms == 1:
        return "bench_one", {}
    return "bench_sleep", {"n": 1, "delay": child_ms / 1000}


def submitter(rate: float, seconds: float, child_ms: float, queue: str | None = None) -> None:
    """In a submitter process: warm up, say "ready", read the common start (epoch seconds)
    on stdin, submit ``rate`` runs a second until ``seconds`` after it (to ``queue`` if given);
    print one JSON line."""
    import dtask
    from dtask.exceptions import Busy, DtaskError

    template, variables = _run_of(child_ms)
    dtask.submit(template, variables).wait(timeout=60)
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    cpu, end = _cpu(), start + seconds
    events: list[tuple[float, float, str]] = []
    i = 0
    while (due := start + i / rate) < end and time.time() < end:
        if due > time.time():
            time.sleep(due - time.time())
        sent, began = time.time(), time.perf_counter()
        try:
            dtask.submit(template, variables, queue=queue)
            outcome = "created"
        except Busy:
            outcome = "busy"
        except DtaskError as exc:
            outcome = type(exc).__name__
        events.append((sent - start, time.perf_counter() - began, outcome))
        i += 1
    print(json.dumps({"events": events, "cpu": _cpu() - cpu}), flush=True)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _unfinished(engine: Any, base: int) -> int:
    from sqlalchemy import text

    query = text(f"SELECT count(*) FROM dtask_runs WHERE id > :base AND {UNFINISHED}")
    with engine.connect() as conn:
        return int(conn.execute(query, {"base": base}).scalar_one())


def _last_id(engine: Any) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM dtask_runs")).scalar_one())


def _finished_at(engine: Any, base: int, hi: int | None = None) -> list[float]:
    from sqlalchemy import text

    query = text(
        "SELECT extract(epoch FROM finished_at) FROM dtask_runs WHERE id > :base"
        " AND (CAST(:hi AS bigint) IS NULL OR id <= :hi) AND state = 'succeeded'"
        " ORDER BY finished_at"
    )
    with engine.connect() as conn:
        return [float(t) for (t,) in conn.execute(query, {"base": base, "hi": hi})]


def _drain(engine: Any, base: int, bound: float) -> float:
    """Seconds until no run after ``base`` is unfinished (TimeoutError past ``bound``)."""
    began = time.monotonic()
    while _unfinished(engine, base):
        if time.monotonic() - began > bound:
            raise TimeoutError(f"runs still unfinished {bound:g} s on")
        time.sleep(0.2)
    return time.monotonic() - began


def _submitters(
    count: int,
    rate: float,
    seconds: float,
    cap: int | None,
    child_ms: float,
    queue: str | None = None,
) -> list[Any]:
    env = {**os.environ, **({"DTASK_MAX_BACKLOG": str(cap)} if cap else {})}
    argv = [sys.executable, "-m", "bench.overload", "--submitter", str(rate / count),
            "--child-ms", str(child_ms), *(["--queue", queue] if queue else [])]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*argv, "--seconds", str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if not any(line.strip() == "ready" for line in proc.stdout):
            raise RuntimeError("a submitter did not start")
    return procs


def _release(procs: list[Any], start: float, bound: float) -> tuple[list[list[Any]], float]:
    """Start the submitters together at ``start``: their events, and the CPU they used."""
    _go(procs, start)
    return _reports(procs, bound)


def _go(procs: list[Any], start: float) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start}\n")
        proc.stdin.flush()


def _reports(procs: list[Any], bound: float) -> tuple[list[list[Any]], float]:
    reports = [json.loads(p.communicate(timeout=bound)[0].splitlines()[-1]) for p in procs]
    return [e for r in reports for e in r["events"]], sum(r["cpu"] for r in reports)


def capacity(engine: Any, submitters: int, workers: list[Any], child_ms: float) -> float:
    """Completions per second of the workers draining a queue of runs submitted one by one
    (as the load is), after the submitters stopped: the workers alone on the machine. The
    workers are frozen (SIGSTOP) while the queue fills, or they would keep up with it."""
    seconds = max(2.0, 8.0 / child_ms)  # a queue of a few seconds' work, or more
    procs = _submitters(submitters, 1e9, seconds, None, child_ms)  # as fast as each can
    base = _last_id(engine)
    start = time.time() + 0.5
    for proc in workers:
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        _release(procs, start, seconds + 600)
    finally:
        for proc in workers:
            os.killpg(proc.pid, signal.SIGCONT)
    thawed = time.time()
    _drain(engine, base, 600)
    done = [t for t in _finished_at(engine, base) if t > thawed]
    if len(done) < 100:
        raise RuntimeError(f"only {len(done)} runs left to drain: raise the seconds")
    lo, hi = len(done) // 10, 9 * len(done) // 10
    return (hi - lo) / (done[hi] - done[lo])


ELSEWHERE = "bench-overload-elsewhere"  # a queue no worker consumes
LOADED_WINDOW = 10.0  # seconds the loaded capacity is measured over


def loaded_capacity(
    engine: Any, submitters: int, workers: list[Any], child_ms: float, rate: float, cap: int
) -> float:
    """The workers' capacity with the same submitters running, in the same run: a queue filled
    while the workers are frozen (as ``capacity``), drained while the submitters submit at
    the offered ``rate`` under the same cap to a queue no worker consumes (each submit costs
    what the load's do: the cap's count, the run's row, its pickup); completions per second
    of the filled queue while they run, between the 10th and the 90th percentile."""
    from sqlalchemy import text

    loaded = _submitters(submitters, rate, LOADED_WINDOW, cap, child_ms, ELSEWHERE)
    seconds = max(2.0, 8.0 / child_ms)
    filling = _submitters(submitters, 1e9, seconds, None, child_ms)
    base = _last_id(engine)
    for proc in workers:
        os.killpg(proc.pid, signal.SIGSTOP)
    try:
        _release(filling, time.time() + 0.5, seconds + 600)
        hi = _last_id(engine)
        start = time.time() + 0.5
        _go(loaded, start)
        time.sleep(max(0.0, start - time.time()))
    finally:
        for proc in workers:
            os.killpg(proc.pid, signal.SIGCONT)
    _reports(loaded, LOADED_WINDOW + 600)
    with engine.begin() as conn:  # the load's runs were only its cost: none will run
        conn.execute(
            text(
                "UPDATE dtask_runs SET state = 'cancelled', finished_at = now()"
                f" WHERE queue = :q AND {UNFINISHED}"
            ),
            {"q": ELSEWHERE},
        )
    _drain(engine, base, 600)
    done = [t for t in _finished_at(engine, base, hi) if start <= t <= start + LOADED_WINDOW]
    if len(done) < 100:
        raise RuntimeError(f"only {len(done)} runs finished while the submitters ran")
    lo, up = len(done) // 10, 9 * len(done) // 10
    return (up - lo) / (done[up] - done[lo])


def overload(
    seconds: float,
    factor: float,
    submitters: int,
    backlog_seconds: float,
    concurrency: int,
    child_ms: float,
    pickup: str,
) -> dict[str, Any]:
    work = prepare_environment(DTASK_PICKUP=pickup)  # the submitters inherit it
    from dtask import services
    from dtask.services import embedded

    services.ensure_broker()
    engine = services.store().engine
    workers = Workers(work)
    try:
        workers.ready(workers.dtask(concurrency))
        found = capacity(engine, submitters, workers.procs, child_ms)
        rate, cap = factor * found, int(backlog_seconds * found)
        loaded = loaded_capacity(engine, submitters, workers.procs, child_ms, rate, cap)
        print(f"capacity {found:.0f} runs/s alone, {loaded:.0f} with the submitters running;"
              f" submitting {rate:.0f}/s for {seconds:g} s, DTASK_MAX_BACKLOG {cap}",
              flush=True)  # fmt: skip
        procs = _submitters(submitters, rate, seconds, cap, child_ms)  # each warmed up
        base = _last_id(engine)
        start = time.time() + 0.5
        backlog: list[tuple[float, int]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                backlog.append((time.time() - start, _unfinished(engine, base)))
                stop.wait(0.5)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        events, cpu = _release(procs, start, seconds + 600)
        drained = _drain(engine, base, 900)
        stop.set()
        watcher.join()
        finished = [t - start for t in _finished_at(engine, base)]
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    out = _summary(found, rate, cap, seconds, events, finished, backlog, drained)
    loaded_goodput = [g * found / loaded for g in out["goodput_by_window"]]
    out["capacity_loaded_per_s"] = loaded
    out["goodput_loaded_min"] = min(loaded_goodput)
    out["goodput_loaded_mean"] = statistics.fmean(loaded_goodput)
    out["submitters_cpu_share"] = cpu / seconds / (os.cpu_count() or 1)
    out["child_ms"], out["concurrency"], out["pickup"] = child_ms, concurrency, pickup
    return out


def _summary(
    found: float,
    rate: float,
    cap: int,
    seconds: float,
    events: list[list[Any]],
    finished: list[float],
    backlog: list[tuple[float, int]],
    drained: float,
) -> dict[str, Any]:
    windows = int(seconds // WINDOW)
    per_window = [0] * windows
    for t in finished:
        if 0 <= t < windows * WINDOW:
            per_window[int(t // WINDOW)] += 1
    goodput = [n / WINDOW / found for n in per_window]
    created = sorted(e[1] for e in events if e[2] == "created")
    busy = sorted(e[1] for e in events if e[2] == "busy")

    def pct(values: list[float], q: float) -> float:
        return 1000 * values[int(q * (len(values) - 1))] if values else float("nan")

    after = [t for t in finished if t >= seconds]
    return {
        "capacity_per_s": found,
        "offered_per_s": rate,
        "max_backlog": cap,
        "seconds": seconds,
        "submits": len(events),
        "created": len(created),
        "busy": len(busy),
        "other": len(events) - len(created) - len(busy),
        "submit_ms": {
            "p50": pct(created, 0.5),
            "p99": pct(created, 0.99),
            "max": pct(created, 1.0),
        },
        "busy_ms": {"p50": pct(busy, 0.5), "p99": pct(busy, 0.99)},
        "goodput_by_window": [round(g, 3) for g in goodput],
        "goodput_min": min(goodput),
        "goodput_mean": statistics.fmean(goodput),
        "drain_seconds": drained,
        "drain_per_s": len(after) / (max(after) - seconds) if len(after) > 1 else None,
        "completed_each_second": _per_second(finished),
        "submitted_each_second": _per_second([e[0] for e in events if e[2] == "created"]),
        "refused_each_second": _per_second([e[0] for e in events if e[2] == "busy"]),
        "backlog": backlog,
    }


def _per_second(times: list[float]) -> list[int]:
    counts = [0] * (int(max(times, default=0)) + 1)
    for t in times:
        if t >= 0:
            counts[int(t)] += 1
    return counts


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, rates = plt.subplots(figsize=(8, 3.6))
    rates.plot(result["submitted_each_second"], label="runs created per second")
    rates.plot(result["refused_each_second"], label="submits refused (busy) per second")
    rates.plot(result["completed_each_second"], label="runs finished per second")
    rates.axhline(result["capacity_per_s"], color="grey", linestyle="--", label="capacity alone")
    if "capacity_loaded_per_s" in result:
        rates.axhline(
            result["capacity_loaded_per_s"],
            color="black",
            linestyle="--",
            label="capacity with the submitters running",
        )
    rates.axvline(result["seconds"], color="black", linestyle=":", label="submits stop")
    rates.set_xlabel("seconds")
    rates.set_ylabel("per second")
    backlog = rates.twinx()
    backlog.plot(*zip(*result["backlog"], strict=True), color="red", alpha=0.5, label="backlog")
    backlog.axhline(result["max_backlog"], color="red", linestyle=":", alpha=0.5)
    backlog.set_ylabel("unfinished runs", color="red")
    rates.legend(fontsize=7, loc="upper right")
    rates.set_title(
        f"{result['offered_per_s']:.0f} submits/s offered against {result['capacity_per_s']:.0f}"
        f" runs/s of capacity, DTASK_MAX_BACKLOG {result['max_backlog']}"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def markdown(r: dict[str, Any], submitters: int) -> str:
    drain = r["drain_per_s"]
    flags = "" if r["child_ms"] == 1 else f" --child-ms {r['child_ms']:g}"
    flags += "" if r["concurrency"] == 2 else f" --concurrency {r['concurrency']}"
    return "\n".join(
        [
            f"`python -m bench.overload --seconds {r['seconds']:g}{flags}`: {submitters}"
            f" processes offer {r['offered_per_s']:.0f} runs a second of one {r['child_ms']:g}-ms"
            f" child (`dtask.submit`, open loop) for {r['seconds']:g} s to {r['concurrency']}"
            f" worker processes that finish {r['capacity_per_s']:.0f} a second alone (measured"
            " first: how fast they drain runs submitted one by one, with no submitter running)"
            f" and {r.get('capacity_loaded_per_s', float('nan')):.0f} a second with the same"
            " submitters running (the same drain while they submit at the offered rate, under"
            " the same cap, to a queue no worker consumes), with `DTASK_MAX_BACKLOG`"
            f" {r['max_backlog']:,} ({r['max_backlog'] / r['capacity_per_s']:.0f} s of work).",
            "",
            "| | |",
            "|:-|-:|",
            f"| submits | {r['submits']:,}: {r['created']:,} created, {r['busy']:,} busy,"
            f" {r['other']} other |",
            f"| submit latency, created (p50 / p99 / max) | {r['submit_ms']['p50']:.0f} /"
            f" {r['submit_ms']['p99']:.0f} / {r['submit_ms']['max']:.0f} ms |",
            f"| submit latency, busy (p50 / p99) | {r['busy_ms']['p50']:.0f} /"
            f" {r['busy_ms']['p99']:.0f} ms |",
            f"| goodput per 5 s window, of capacity alone (lowest / mean) |"
            f" {r['goodput_min']:.0%} / {r['goodput_mean']:.0%} |",
            "| goodput per 5 s window, of capacity with the submitters running (lowest / mean)"
            f" | {r.get('goodput_loaded_min', float('nan')):.0%} /"
            f" {r.get('goodput_loaded_mean', float('nan')):.0%} |",
            f"| submitters' CPU, share of the machine's {os.cpu_count()} cores |"
            f" {r['submitters_cpu_share']:.0%} |",
            f"| backlog drained after the submits stopped | {r['drain_seconds']:.1f} s"
            + (f", {drain:.0f} runs/s |" if drain else " |"),
            "",
            "Goodput per window: " + ", ".join(f"{g:.0%}" for g in r["goodput_by_window"]) + ".",
            "",
            f"![overload](benchmarks/{name(r['child_ms'])}.png)",
        ]
    )


def name(child_ms: float) -> str:
    """The file name, without its suffix, of the results and plot of runs of ``child_ms``."""
    return "overload" if child_ms == 1 else f"overload-{child_ms:g}ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--factor", type=float, default=2.0, help="offered load / capacity")
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--backlog", type=float, default=10.0, help="cap, in seconds of work")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--child-ms", type=float, default=1.0, help="each run's one child")
    parser.add_argument("--pickup", choices=("0", "1"), default="1", help="DTASK_PICKUP")
    parser.add_argument("--submitter", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.submitter is not None:
        submitter(args.submitter, args.seconds, args.child_ms, args.queue)
        return 0
    began = time.monotonic()
    result = overload(
        args.seconds,
        args.factor,
        args.submitters,
        args.backlog,
        args.concurrency,
        args.child_ms,
        args.pickup,
    )
    result["wall"] = time.monotonic() - began
    result["markdown"] = markdown(result, args.submitters)
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name(args.child_ms)}.json").write_text(json.dumps(result))
    from bench.report import PLOTS

    plot(result, PLOTS / f"{name(args.child_ms)}.png")
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
