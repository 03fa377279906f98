"""Turn bench/out/results.json into docs/benchmarks.md and its plots (docs/benchmarks/*.png).

python -m bench.report     # re-render from the last results.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
PLOTS = REPO / "docs" / "benchmarks"
NOTES = REPO / "bench" / "notes.md"
COMMAND = "make bench"


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def fanout_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for n in sorted({r["n"] for r in runs}):
        raw = [r["seconds"] for r in runs if r["n"] == n and r["system"] == "raw"]
        dt = [r["seconds"] for r in runs if r["n"] == n and r["system"] == "dtask"]
        row: dict[str, Any] = {"n": n, "raw_runs": len(raw), "dtask_runs": len(dt)}
        row["raw_s"] = statistics.median(raw) if raw else None
        row["dtask_s"] = statistics.median(dt) if dt else None
        row["ratio"] = row["dtask_s"] / row["raw_s"] if raw and dt else None
        row["pairs"] = [d / r for r, d in zip(raw, dt, strict=False)]  # run k with run k
        row["pair_median"] = statistics.median(row["pairs"]) if row["pairs"] else None
        rows.append(row)
    return rows


def _f(value: float | None, fmt: str = ".1f", none: str = "not run") -> str:
    return none if value is None else format(value, fmt)


def _rate(n: int, seconds: float | None) -> str:
    return "not run" if seconds is None else f"{n / seconds:.0f}"


def fanout_section(results: dict[str, Any]) -> list[str]:
    rows = fanout_rows(results["fanout"])
    lines = [
        "| N children | runs raw / dtask | raw median s | raw children/s | dtask median s"
        " | dtask children/s | time ratio of the medians | time ratio run by run (median) |",
        "|---:|:-:|---:|---:|---:|---:|---:|:-|",
    ]
    for r in rows:
        pairs = ", ".join(f"{x:.2f}" for x in r["pairs"])
        pairs = f"{pairs} ({r['pair_median']:.2f})" if r["pairs"] else "n/a"
        lines.append(
            f"| {r['n']:,} | {r['raw_runs']} / {r['dtask_runs']} | {_f(r['raw_s'])}"
            f" | {_rate(r['n'], r['raw_s'])} | {_f(r['dtask_s'])} | {_rate(r['n'], r['dtask_s'])}"
            f" | {_f(r['ratio'], '.2f', 'n/a')} | {pairs} |"
        )
    lines += ["", "Every run, in the order they ran (raw and dtask alternate):", ""]
    lines += ["| N | system | seconds | children/s |", "|---:|:-|---:|---:|"]
    for r in results["fanout"]:
        lines.append(
            f"| {r['n']:,} | {r['system']} | {r['seconds']:.1f} | {r['n'] / r['seconds']:.0f} |"
        )
    lines += ["", "CPU seconds per child by process, median run of each size (both systems' idle"
              " workers included):", ""]  # fmt: skip
    roles = ["bench", "raw client", "dtask main", "dtask pool", "raw main", "raw pool",
             "redis", "postgres"]  # fmt: skip
    lines += [
        "| N | system | " + " | ".join(roles) + " | total |",
        "|---:|:-|" + "---:|" * (len(roles) + 1),
    ]
    for r in _median_runs(results["fanout"]):
        cpu = r["cpu"]
        cells = [f"{1000 * cpu.get(k, 0) / r['n']:.2f}" for k in roles]
        total = 1000 * sum(cpu.values()) / r["n"]
        lines.append(f"| {r['n']:,} | {r['system']} | " + " | ".join(cells) + f" | {total:.2f} |")
    lines += ["", "(milliseconds of CPU per child; `bench` is this harness, which for raw includes"
              " its client subprocess that sends the chord)"]  # fmt: skip
    return lines


def _supplementary() -> dict[str, Any]:
    path = REPO / "bench" / "out" / "fanout-only.json"
    return json.loads(path.read_text()) if path.exists() else {}


def supplementary_section() -> list[str]:
    extra = _supplementary()
    if not extra:
        return []
    a = extra["args"]
    command = f"make bench BENCH_ARGS='--fanout-only --sizes {a['sizes']}"
    command += " --raw-big'" if a["raw_big"] else "'"
    lines = [
        f"Supplementary fan-out run, outside the 15-minute budget: `{command}` on"
        f" {extra['started']} ({extra['seconds'] / 60:.1f} min), same harness and settings:",
        "",
        "| N | system | seconds | children/s | peak RSS MB by process |",
        "|---:|:-|---:|---:|:-|",
    ]
    for r in extra["fanout"]:
        rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.get("rss_mb", {}).items()))
        lines.append(
            f"| {r['n']:,} | {r['system']} | {r['seconds']:.1f} | {r['n'] / r['seconds']:.0f}"
            f" | {rss} |"
        )
    rows = fanout_rows(extra["fanout"])
    lines += [""] + [f"Time ratio dtask/raw at N={r['n']:,}: **{r['ratio']:.2f}**."
                     for r in rows if r["ratio"] is not None]  # fmt: skip
    return [*lines, ""]


def _median_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in sorted({r["n"] for r in runs}):
        for system in ("raw", "dtask"):
            same = sorted((r for r in runs if r["n"] == n and r["system"] == system),
                          key=lambda r: r["seconds"])  # fmt: skip
            if same:
                out.append(same[len(same) // 2])
    return out


def cost_section(cost: dict[str, Any]) -> list[str]:
    n = cost["n"]
    lines = [
        "| system | PostgreSQL statements / child | Redis commands / child"
        " | Redis bytes on the wire / child |",
        "|:-|---:|---:|---:|",
    ]
    for system in ("raw", "dtask"):
        c = cost[system]
        statements = sum(c["pg"].values())
        lines.append(
            f"| {system} | {statements / n:.2f} | {c['redis_commands'] / n:.1f}"
            f" | {c['redis_bytes'] / n:,.0f} |"
        )
    lines += ["", f"dtask's statements at N={n:,} by kind (all processes except the harness):", ""]
    lines += ["| statement | count | per child |", "|:-|---:|---:|"]
    for kind, count in sorted(cost["dtask"]["pg"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| `{kind}` | {count} | {count / n:.3f} |")
    return lines


def memory_section(results: dict[str, Any]) -> list[str]:
    big = [r for r in results["fanout"] if r.get("rss_mb")]
    if not big:
        return ["No run sampled memory."]
    lines = ["| run | process | peak RSS MB |", "|:-|:-|---:|"]
    for r in big:
        for role, mb in sorted(r["rss_mb"].items()):
            lines.append(f"| {r['system']} N={r['n']:,} | {role} | {mb:.0f} |")
    return lines


def latency_section(samples: list[list[float]]) -> list[str]:
    master = [s[0] * 1000 for s in samples]
    child = [s[1] * 1000 for s in samples]
    return [
        "| from submit to | p50 ms | p99 ms | max ms |",
        "|:-|---:|---:|---:|",
        f"| master running | {pct(master, 50):.0f} | {pct(master, 99):.0f} | {max(master):.0f} |",
        f"| first child running | {pct(child, 50):.0f} | {pct(child, 99):.0f} | {max(child):.0f} |",
    ]


def failover_section(failover: dict[str, list[float]]) -> list[str]:
    names = {
        "kill_resumed": "SIGKILL worker -> child running elsewhere",
        "term_exited": "SIGTERM worker -> worker exited",
        "term_resumed": "SIGTERM worker -> child running elsewhere",
    }
    lines = ["| measure | n | p50 s | max s | all (s) |", "|:-|---:|---:|---:|:-|"]
    for key, label in names.items():
        v = failover.get(key) or []
        if v:
            every = ", ".join(f"{x:.2f}" for x in v)
            lines.append(f"| {label} | {len(v)} | {pct(v, 50):.2f} | {max(v):.2f} | {every} |")
    return lines


def scale_section(curve: list[dict[str, Any]], n_cpu: int) -> list[str]:
    lines = [
        "| worker processes | raw children/s | dtask children/s | time ratio dtask/raw |",
        "|---:|---:|---:|---:|",
    ]
    for c in sorted({r["concurrency"] for r in curve}):
        raw = next(r for r in curve if r["concurrency"] == c and r["system"] == "raw")
        dt = next(r for r in curve if r["concurrency"] == c and r["system"] == "dtask")
        lines.append(
            f"| {c} | {raw['n'] / raw['seconds']:.0f} | {dt['n'] / dt['seconds']:.0f}"
            f" | {dt['seconds'] / raw['seconds']:.2f} |"
        )
    lines += ["", f"This machine has {n_cpu} CPUs. With prefetch 1 a pool process spends much of"
              " each child waiting on round trips (broker, result backend, PostgreSQL), so at 2"
              " processes the cluster is latency-bound rather than CPU-bound and more processes"
              " can still add throughput; they then compete for the same cores with the"
              " worker's main process, Redis and PostgreSQL. One run per point."]  # fmt: skip
    return lines


def targets(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = {r["n"]: r for r in fanout_rows(results["fanout"])}
    out = []
    extra = {r["n"]: r for r in fanout_rows(_supplementary().get("fanout", []))}
    for n in (10_000, 100_000):
        r, where = rows.get(n), ""
        if (r is None or r["ratio"] is None) and n in extra:
            r, where = extra[n], ", supplementary run"
        if r is None or r["ratio"] is None:
            out.append((f"dtask/raw time ratio <= 1.0 at N={n:,}", "not measured", "n/a"))
            continue
        both = (r["ratio"], r["pair_median"])
        verdict = "met" if max(both) <= 1.0 else "missed" if min(both) > 1.0 else "borderline"
        measured = f"{both[0]:.2f} (medians), {both[1]:.2f} (run by run){where}"
        if len(r["pairs"]) == 1:
            measured = f"{both[0]:.2f} (one run each{where})"
        out.append((f"dtask/raw time ratio <= 1.0 at N={n:,}", measured, verdict))
    small, big = rows.get(10_000), rows.get(100_000)
    if small and big and small["dtask_s"] and big["dtask_s"]:
        growth = big["dtask_s"] / small["dtask_s"]
        out.append(("dtask time(100k) / time(10k) <= 11", f"{growth:.2f}",
                    "met" if growth <= 11 else "missed"))  # fmt: skip
    peaks = [mb for r in results["fanout"] if r["n"] >= 100_000 and r["system"] == "dtask"
             for mb in r.get("rss_mb", {}).values()]  # fmt: skip
    if peaks:
        out.append(("peak RSS < 500 MB in every process at 100k", f"{max(peaks):.0f} MB",
                    "met" if max(peaks) < 500 else "missed"))  # fmt: skip
    child = [s[1] * 1000 for s in results["latency"]]
    out.append(("submit -> first child running p50 <= 100 ms", f"{pct(child, 50):.0f} ms",
                "met" if pct(child, 50) <= 100 else "missed"))  # fmt: skip
    out.append(("submit -> first child running p99 <= 500 ms", f"{pct(child, 99):.0f} ms",
                "met" if pct(child, 99) <= 500 else "missed"))  # fmt: skip
    out.append(("`make bench` under 15 minutes", f"{results['seconds'] / 60:.1f} min",
                "met" if results["seconds"] < 900 else "missed"))  # fmt: skip
    return out


def plots(results: dict[str, Any]) -> list[str]:
    PLOTS.mkdir(parents=True, exist_ok=True)
    names = []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for system, marker in (("raw", "o"), ("dtask", "s")):
        pts = [(r["n"], r["n"] / r["seconds"]) for r in results["fanout"] if r["system"] == system]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=system, marker=marker)
    ax.set_xscale("log")
    ax.set_xlabel("children per master (N)")
    ax.set_ylabel("children/s, submit to master done")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("Fan-out throughput, every run")
    names.append(_save(fig, "fanout.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, label in enumerate(("master running", "first child running")):
        values = sorted(s[i] * 1000 for s in results["latency"])
        ax.plot(values, [k / len(values) for k in range(1, len(values) + 1)], label=label)
    ax.set_xlabel("ms after submit")
    ax.set_ylabel("fraction of submissions")
    ax.legend()
    ax.set_title(f"Latency on an idle cluster ({len(results['latency'])} submissions)")
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
    for system, marker in (("raw", "o"), ("dtask", "s")):
        pts = sorted((r["concurrency"], r["n"] / r["seconds"]) for r in results["scale"]
                     if r["system"] == system)  # fmt: skip
        ax.plot(*zip(*pts, strict=True), marker=marker, label=system)
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


PEERS = REPO / "bench" / "out" / "peers.md"


def _peers() -> list[str]:
    """The side-by-side with stock Celery, Dramatiq and Procrastinate (bench/peers.py), where it
    ran."""
    if not PEERS.exists():
        return []
    return ["## Against its peers", "", PEERS.read_text().rstrip(), ""]


def write(results: dict[str, Any]) -> None:
    images = plots(results)
    args = results["args"]
    n_cpu = os.cpu_count() or 0
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `{COMMAND}` (bench/run.py) on {results['started']}: the harness ran"
        f" **{results['seconds'] / 60:.1f} min**. Machine: {n_cpu} x {_cpu_model()}, shared with"
        " other work, so absolute numbers are noisy; every comparison is against raw Celery in"
        " the same run, on the same embedded Redis, with the same Celery settings"
        " (dtask's `celery_settings`) and the same worker flags and concurrency"
        f" (`-c {args['concurrency']}`), raw and dtask runs alternating.",
        "",
        "Raw Celery baseline: `chord(child.s(i, i) for i in range(N))(done.s())` sent from a"
        " fresh client process (bench/raw_client.py), timed from `apply_async` until"
        " `AsyncResult(callback_id).get()` returns (not the chord's own result, which is"
        " quadratic in N: DESIGN.md). dtask: `dtask.submit('bench_noop', {'n': N})` until the"
        " run's `finished_at` in PostgreSQL. Both children do nothing.",
        "",
        "## Targets",
        "",
        "| target | measured | |",
        "|:-|---:|:-|",
        *[f"| {t} | {m} | {v} |" for t, m, v in targets(results)],
        "",
        *_peers(),
        "## 1. Fan-out throughput",
        "",
        f"Median of {args['repeats']} alternating runs per size below {args['big']:,}; sizes from"
        f" {args['big']:,} up run once"
        + (
            ""
            if args["raw_big"]
            else ", dtask only (raw Celery at that size takes another 5-6 minutes here, which"
            " does not fit the 15-minute budget: `make bench BENCH_ARGS=--raw-big` adds it,"
            " and the supplementary run below has it)"
        )
        + ".",
        "",
        *fanout_section(results),
        "",
        *supplementary_section(),
        f"![fan-out](benchmarks/{images[0]})",
        "",
        "## 2. Cost per child",
        "",
        "One extra counted run of each system. PostgreSQL statements: `log_statement = all`"
        " with the application name in each line, counted from the server log (pgserver ships"
        " no `pg_stat_statements`); the harness's own polling is excluded, transaction control"
        " (`BEGIN`/`COMMIT`) and connection pings are included. Redis: `INFO commandstats` and"
        " `total_net_input_bytes + total_net_output_bytes` after `CONFIG RESETSTAT`, for every"
        " client (workers, the raw client, events). PostgreSQL bytes on the wire are not"
        " counted (Unix socket, no counter).",
        "",
        *cost_section(results["cost"]),
        "",
        "## 3. Memory at the largest N",
        "",
        "Peak RSS sampled every 0.5 s. `bench` is the submitting process (dtask.submit and"
        " the polling); `dtask pool` is the larger of the pool processes, one of which ran the"
        " master (split, insert, publish); raw Celery's worker sits idle during a dtask run.",
        "",
        *memory_section(results),
        "",
        "## 4. Latency",
        "",
        f"{len(results['latency'])} submissions of a one-child run, each after the previous"
        " finished (idle cluster, 2 pool processes). Times from `submit()` in the client to"
        " the run's `started_at` (master's split began) and the child's `started_at`, both"
        " written by PostgreSQL on the same host clock.",
        "",
        *latency_section(results["latency"]),
        "",
        f"![latency](benchmarks/{images[1]})",
        "",
        "## 5. Failover and drain",
        "",
        "Three one-process workers with default settings (lease 8 s, heartbeat 2 s, reaper"
        " 1 s). A child printing 300 items at 10 ms each; once it has checkpointed, its whole"
        " worker (process group) gets SIGKILL, or SIGTERM for the drain rounds; a"
        " replacement worker starts after each round.",
        "",
        *failover_section(results["failover"]),
        "",
        f"![failover](benchmarks/{images[2]})",
        "",
        "## 6. Scale curve",
        "",
        f"N={args['scale_n']:,}, one worker of each system with 1, 2, 4 pool processes, one run"
        " each.",
        "",
        *scale_section(results["scale"], n_cpu),
        "",
        f"![scale](benchmarks/{images[3]})",
        "",
        "## Profile",
        "",
        f"`{results['profile']['command']}` during a separate dtask run of"
        f" N={results['profile']['n']:,} ({results['profile']['seconds']:.1f} s under the"
        " profiler). Summary by `python -m bench.collapse bench/out/profile-dtask.txt`:",
        "",
        "```",
        results["profile"]["summary"],
        "```",
        "",
    ]
    if NOTES.exists():
        lines += [NOTES.read_text().rstrip(), ""]
    DOC.write_text("\n".join(lines))


def main() -> int:
    results = json.loads((REPO / "bench" / "out" / "results.json").read_text())
    write(results)
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
