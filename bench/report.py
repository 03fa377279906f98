"""Turn bench/out/ (results.json from bench/run.py, peers.json and peers.md from bench/peers.py,
small_runs.json, busy_latency.json, and bench-big's million.json and peers-amqp.*) into
docs/benchmarks.md and its plots (docs/benchmarks/*.png).

python -m bench.report     # re-render from what bench/out/ holds
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import matplotlib

from bench import report_parts as parts
from bench.report_parts import NAMES, OVERLOADS, load, medians

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
PLOTS = REPO / "docs" / "benchmarks"
NOTES = REPO / "bench" / "notes.md"
COMMAND = "make bench"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    redis, amqp = medians(load("peers.json")), medians(load("peers-amqp.json"))
    for n in (10_000, 100_000):
        d, c, q = redis.get(("dtask", n)), redis.get(("celery", n)), redis.get(("dramatiq", n))
        if d and c:
            r = d[0] / c[0]
            out.append((f"dtask <= 0.5x stock Celery's time at {n:,} (Redis)", f"{r:.2f}x",
                        _verdict(r <= 0.5)))  # fmt: skip
        k = redis.get(("chunks", n))
        if d and k:
            r = d[0] / k[0]
            out.append((f"dtask within 2x of Celery chunks(100)'s time at {n:,}", f"{r:.2f}x",
                        _verdict(r <= 2)))  # fmt: skip
        if d and q:
            r = d[0] / q[0]
            out.append((f"dtask below Dramatiq's time at {n:,}", f"{r:.2f}x", _verdict(r < 1)))
        ad, ac = amqp.get(("dtask", n)), amqp.get(("celery", n))
        if ad and ac:
            r = ad[0] / ac[0]
            out.append((f"dtask <= 0.7x stock Celery's time at {n:,} (RabbitMQ)", f"{r:.2f}x",
                        _verdict(r <= 0.7)))  # fmt: skip
    small, big = redis.get(("dtask", 10_000)), redis.get(("dtask", 100_000))
    if small and big:
        growth = big[0] / small[0]
        out.append(("dtask time(100k) / time(10k) <= 10", f"{growth:.1f}", _verdict(growth <= 10)))
    million = load("million.json") or []
    if len(million) >= 2:
        a, b = million[0], million[-1]
        growth = b["seconds"] / a["seconds"]
        out.append((f"time({b['n']:,}) / time({a['n']:,}) <= 11 (bench-big)", f"{growth:.1f}",
                    _verdict(growth <= 11)))  # fmt: skip
        peak = max(max(r["rss_mb"].values()) for r in million)
        out.append(("peak RSS < 500 MB in every process, 1M children", f"{peak:.0f} MB",
                    _verdict(peak < 500)))  # fmt: skip
        out.append(("1M: every child counted once, run succeeded",
                    f"{b['succeeded']:,} / {b['n']:,}, highest attempt {b['highest_attempt']}",
                    _verdict(all(r["ok"] for r in million))))  # fmt: skip
    cost = results.get("cost")
    if cost:
        n = cost["n"]
        statements = sum(cost["dtask"]["pg"].values()) / n
        out.append((f"<= 0.5 PostgreSQL statements per child (at {n:,})", f"{statements:.2f}",
                    _verdict(statements <= 0.5)))  # fmt: skip
        commands = cost["dtask"]["redis_commands"] / n
        out.append((f"<= 5 broker commands per child (at {n:,})", f"{commands:.2f}",
                    _verdict(commands <= 5)))  # fmt: skip
    if big:
        ms = big[1] * 1000
        out.append(("<= 1 ms CPU per child, all processes, at 100,000", f"{ms:.2f} ms",
                    _verdict(ms <= 1)))  # fmt: skip
    small_runs = load("small_runs.json")
    if small_runs and small_runs.get("ratio") is not None:
        r = small_runs["ratio"]
        out.append(("many small runs: dtask runs/s over stock Celery tasks/s >= 1.0",
                    f"{r:.2f}", _verdict(r >= 1)))  # fmt: skip
    if small_runs and small_runs.get("bulk_ratio") is not None:
        r = small_runs["bulk_ratio"]
        out.append(("many small runs by submit_many: runs/s over Celery's tasks/s >= 3",
                    f"{r:.2f}", _verdict(r >= 3)))  # fmt: skip
    busy = load("busy_latency.json")
    if busy and busy.get("busy_p50_ms") is not None:
        p50, p99 = busy["busy_p50_ms"], busy["busy_p99_ms"]
        out.append(("submit -> first child p50 <= 50 ms while 100k busy", f"{p50:.0f} ms",
                    _verdict(p50 <= 50)))  # fmt: skip
        out.append(("submit -> first child p99 <= 250 ms while 100k busy", f"{p99:.0f} ms",
                    _verdict(p99 <= 250)))  # fmt: skip
    for name, child in OVERLOADS:
        over = load(f"{name}.json")
        if over:
            # the capacity measured with the same submitters running (an older run: alone)
            low = over.get("goodput_loaded_min", over["goodput_min"])
            p99 = over["submit_ms"]["p99"]
            out.append((f"overload, {child} children: goodput >= 90 % of capacity in every 5 s"
                        " window", f"{low:.0%}", _verdict(low >= 0.9)))  # fmt: skip
            out.append((f"overload, {child} children: p99 submit <= 250 ms under the backlog"
                        " cap", f"{p99:.0f} ms", _verdict(p99 <= 250)))  # fmt: skip
    minutes = total_minutes(results)
    out.append(("`make bench` under 15 minutes", f"{minutes:.1f} min", _verdict(minutes < 15)))
    return out


def total_minutes(results: dict[str, Any]) -> float:
    seconds = results["seconds"]
    for name in ("peers.json", "small_runs.json", "busy_latency.json"):
        seconds += (load(name) or {}).get("seconds", 0)
    for name, _ in OVERLOADS:
        seconds += (load(f"{name}.json") or {}).get("wall", 0)
    return float(seconds / 60)


def plots(results: dict[str, Any]) -> list[str]:
    PLOTS.mkdir(parents=True, exist_ok=True)
    names = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    peers = medians(load("peers.json"))
    sizes = sorted({n for _, n in peers})
    systems = [s for s in NAMES if any(k[0] == s for k in peers)]
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        xs = [k + i * width for k, n in enumerate(sizes) if (system, n) in peers]
        ys = [n / peers[(system, n)][0] for n in sizes if (system, n) in peers]
        ax.bar(xs, ys, width, label=NAMES[system])
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(sizes))], [f"{n:,}" for n in sizes])
    ax.set_xlabel("children per run (N), no-op")
    ax.set_ylabel("children/s, submit to done")
    ax.legend()
    ax.set_title("Fan-out throughput, median run (Redis broker)")
    names.append(_save(fig, "fanout.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    curves = [("idle: first child running", [s[1] * 1000 for s in results["latency"]])]
    busy = load("busy_latency.json") or {}
    if busy.get("busy_ms"):
        curves.append(("while a 100k run is busy", busy["busy_ms"]))
    for label, values in curves:
        values = sorted(values)
        ax.plot(values, [k / len(values) for k in range(1, len(values) + 1)], label=label)
    ax.set_xlabel("ms after submit")
    ax.set_ylabel("fraction of submissions")
    ax.legend()
    ax.set_title("Submit -> first child running")
    names.append(_save(fig, "latency.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = [
        k for k in ("kill_resumed", "term_exited", "term_resumed") if results["failover"].get(k)
    ]
    ax.boxplot([results["failover"][k] for k in keys], showfliers=True)
    ax.set_xticks(range(1, len(keys) + 1), [k.replace("_", " -> ") for k in keys])
    ax.set_ylabel("seconds")
    ax.set_title("Failover (SIGKILL) and drain (SIGTERM)")
    names.append(_save(fig, "failover.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for system, marker, label in (("raw", "o", "stock Celery"), ("dtask", "s", "dtask")):
        pts = sorted((r["concurrency"], r["n"] / r["seconds"]) for r in results["scale"]
                     if r["system"] == system)  # fmt: skip
        ax.plot(*zip(*pts, strict=True), marker=marker, label=label)
    ax.set_xticks([1, 2, 4])
    ax.set_xlabel("worker pool processes (2-CPU machine)")
    ax.set_ylabel("children/s")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("Scale curve")
    names.append(_save(fig, "scale.png"))
    return names


def _save(fig: Any, name: str) -> str:
    fig.tight_layout()
    fig.savefig(PLOTS / name, dpi=90)
    plt.close(fig)
    return name


def write(results: dict[str, Any]) -> None:
    images = plots(results)
    args = results["args"]
    n_cpu = os.cpu_count() or 0
    peers = load("peers.json") or {}
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{COMMAND}` (bench/peers.py, bench/small_runs.py, bench/busy_latency.py,"
        f" bench/run.py), finished {results['started']}: **{total_minutes(results):.1f} min**"
        f" in all. Machine: {n_cpu} x {_cpu_model()}, shared with other work, so absolute"
        " numbers are noisy: every comparison is between systems measured in the same run,"
        " on the same embedded Redis and PostgreSQL, with the same number of worker processes"
        " (2), their runs alternating. The baselines run as their users run them: stock Celery"
        " with Celery's defaults (events off, prefetch 4, WARNING logs), Dramatiq with Redis"
        " (a group with a completion callback), Procrastinate on the same PostgreSQL; dtask"
        " with its defaults as shipped.",
        "",
        "## Targets (issues 22 and 41)",
        "",
        "| target | measured | |",
        "|:-|---:|:-|",
        *[f"| {t} | {m} | {v} |" for t, m, v in targets(results)],
        "",
        "## 1. Fan-out against its peers",
        "",
        "N no-op children from one submitter, then a completion callback (dtask: the run's"
        " `finished_at`; stock Celery: `chord(...)(done.s())` until the callback's result;"
        " Dramatiq: `group(...).add_completion_callback`; Procrastinate, which has no fan-in:"
        " `batch_defer` of N jobs until the last succeeded). Sizes below"
        f" {peers.get('big', 100_000):,} run {peers.get('repeats', 3)} times each"
        f"{_once(peers)}, larger ones once (Celery, Dramatiq and dtask; Procrastinate at the"
        " smaller sizes only).",
        "",
        *parts.peers_section("peers.md", "Not run (`python -m bench.peers`)."),
        f"![fan-out](benchmarks/{images[0]})",
        "",
        "## 2. RabbitMQ as the broker",
        "",
        *parts.peers_section(
            "peers-amqp.md",
            "Not run: `make bench-big` runs `python -m bench.peers --broker amqp`.",
        ),
        "## 3. A million children",
        "",
        *parts.million_section(),
        "## 4. Many small runs",
        "",
        *parts.small_runs_section(),
        "### Overload",
        "",
        *parts.overload_section(),
        "## 5. Latency",
        "",
        f"Idle: {len(results['latency'])} submissions of a one-child run, each after the"
        " previous finished (2 pool processes). Times from `submit()` to the run's"
        " `started_at` (its split began) and its child's `started_at`, both written by"
        " PostgreSQL on the same host clock.",
        "",
        *parts.latency_section(results["latency"]),
        "",
        "While busy:",
        "",
        *parts.busy_section(),
        f"![latency](benchmarks/{images[1]})",
        "",
        "## 6. Cost per child",
        "",
        f"One counted run of each system at N={results['cost']['n']:,}. PostgreSQL statements:"
        " `log_statement = all` with the application name in each line, counted from the"
        " server log (pgserver ships no `pg_stat_statements`); the harness's own polling is"
        " excluded, transaction control (`BEGIN`/`COMMIT`) included. Redis: `INFO"
        " commandstats` and bytes in and out after `CONFIG RESETSTAT`, for every client."
        " CPU per child, every process: section 1's second table.",
        "",
        *parts.cost_section(results["cost"]),
        "",
        "## 7. Failover and drain",
        "",
        "Three one-process workers with default settings (lease 8 s, heartbeat 2 s, reaper"
        " 1 s). A child printing 300 items at 10 ms each; once it has checkpointed, its whole"
        " worker (process group) gets SIGKILL, or SIGTERM for the drain rounds; a"
        " replacement worker starts after each round.",
        "",
        *parts.failover_section(results["failover"]),
        "",
        f"![failover](benchmarks/{images[2]})",
        "",
        "## 8. Scale curve",
        "",
        f"N={args['scale_n']:,}, one worker of each system with 1, 2, 4 pool processes, one run"
        " each.",
        "",
        *parts.scale_section(results["scale"], n_cpu),
        "",
        f"![scale](benchmarks/{images[3]})",
        "",
        "## 9. Where the time goes: profiles before and after",
        "",
        *parts.profile_section(results["profile"]),
    ]
    if NOTES.exists():
        lines += [NOTES.read_text().rstrip(), ""]
    DOC.write_text("\n".join(lines))


def _once(peers: dict[str, Any]) -> str:
    once = [NAMES.get(s, s) for s in peers.get("once", [])]
    return f" ({' and '.join(once)} once: one run places it)" if once else ""


def main() -> int:
    results = json.loads((REPO / "bench" / "out" / "results.json").read_text())
    write(results)
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
