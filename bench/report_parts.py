"""The sections of docs/benchmarks.md, each from one benchmark's output in bench/out/ (a
section whose benchmark has not run says so). bench/report.py puts them together."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
NAMES = {"dtask": "dtask", "celery": "stock Celery", "chunks": "Celery chunks(100)",
         "dramatiq": "Dramatiq", "procrastinate": "Procrastinate"}  # fmt: skip


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def load(name: str) -> Any:
    path = OUT / name
    return json.loads(path.read_text()) if path.exists() else None


def medians(peers: dict[str, Any] | None) -> dict[tuple[str, int], tuple[float, float]]:
    """(system, N) -> (median seconds, median CPU seconds per child)."""
    if not peers:
        return {}
    return {
        (r["system"], r["n"]): (
            statistics.median(r["seconds"]),
            statistics.median(r["cpu"]) / r["n"],
        )
        for r in peers["runs"]
    }


def peers_section(name: str, missing: str) -> list[str]:
    path = OUT / name
    if not path.exists():
        return [missing, ""]
    return [path.read_text().rstrip(), ""]


def million_section() -> list[str]:
    runs = load("million.json")
    if not runs:
        return ["Not run: `make bench-big` runs it (100,000 then 1,000,000 children).", ""]
    first = runs[0]
    lines = [
        "`python -m bench.million` (`make bench-big`): one dtask worker `-c 2`, no-op children,"
        " one run per size in the same cluster, Redis and processes sampled every 0.5 s.",
        "",
        "| N | state | children succeeded | highest attempt | seconds | children/s"
        f" | time / time({first['n']:,}) | peak RSS MB by process | Redis used_memory MiB"
        " (before / peak) | broker messages at most |",
        "|---:|:-|---:|---:|---:|---:|---:|:-|---:|---:|",
    ]
    for r in runs:
        rss = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["rss_mb"].items()))
        lines.append(
            f"| {r['n']:,} | {r['state']} | {r['succeeded']:,} | {r['highest_attempt']}"
            f" | {r['seconds']:.0f} | {r['rate']:.0f} | {r['seconds'] / first['seconds']:.1f}"
            f" | {rss} | {r['redis_mb_before']:.1f} / {r['redis_mb_peak']:.1f}"
            f" | {r['broker_messages_peak']} |"
        )
    return [*lines, ""]


def small_runs_section() -> list[str]:
    small = load("small_runs.json")
    if not small:
        return ["Not run (`python -m bench.small_runs`).", ""]
    return [*small.get("markdown", json.dumps(small)).rstrip().splitlines(), ""]


# bench.overload's results: its file name, and the length of its runs' one child. With 1-ms
# children the workers' capacity is their CPU, which the submitters on the same two cores
# share; with 50-ms children it is their processes' time, as where clients run elsewhere.
OVERLOADS = (("overload", "1-ms"), ("overload-50ms", "50-ms"))


def overload_section() -> list[str]:
    out = []
    for name, child in OVERLOADS:
        found = load(f"{name}.json")
        out += [f"#### {child} children", ""]
        if not found:
            out += [f"Not run (`python -m bench.overload`, {name}).", ""]
        else:
            out += [*found["markdown"].rstrip().splitlines(), ""]
    return out


def busy_section() -> list[str]:
    busy = load("busy_latency.json")
    if not busy:
        return ["Not run (`python -m bench.busy_latency`).", ""]
    return [*busy.get("markdown", json.dumps(busy)).rstrip().splitlines(), ""]


def latency_section(samples: list[list[float]]) -> list[str]:
    master = [s[0] * 1000 for s in samples]
    child = [s[1] * 1000 for s in samples]
    return [
        "| from submit to | p50 ms | p99 ms | max ms |",
        "|:-|---:|---:|---:|",
        f"| master running | {pct(master, 50):.0f} | {pct(master, 99):.0f} | {max(master):.0f} |",
        f"| first child running | {pct(child, 50):.0f} | {pct(child, 99):.0f} | {max(child):.0f} |",
    ]


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
        name = "stock Celery" if system == "raw" else "dtask"
        lines.append(
            f"| {name} | {statements / n:.2f} | {c['redis_commands'] / n:.2f}"
            f" | {c['redis_bytes'] / n:,.0f} |"
        )
    lines += ["", f"dtask's statements at N={n:,} by kind (all processes except the harness):", ""]
    lines += ["| statement | count | per child |", "|:-|---:|---:|"]
    for kind, count in sorted(cost["dtask"]["pg"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| `{kind}` | {count} | {count / n:.3f} |")
    return lines


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
        "| worker processes | stock Celery children/s | dtask children/s | time ratio |",
        "|---:|---:|---:|---:|",
    ]
    for c in sorted({r["concurrency"] for r in curve}):
        raw = next(r for r in curve if r["concurrency"] == c and r["system"] == "raw")
        dt = next(r for r in curve if r["concurrency"] == c and r["system"] == "dtask")
        lines.append(
            f"| {c} | {raw['n'] / raw['seconds']:.0f} | {dt['n'] / dt['seconds']:.0f}"
            f" | {dt['seconds'] / raw['seconds']:.2f} |"
        )
    lines += ["", f"This machine has {n_cpu} CPUs: past 2 processes the workers compete for the"
              " same cores with Redis and PostgreSQL. One run per point."]  # fmt: skip
    return lines


def profile_section(profile: dict[str, Any]) -> list[str]:
    before = REPO / "bench" / "profile-before.txt"
    lines = [
        f"After: `{profile['command']}` during a separate dtask run of N={profile['n']:,}"
        f" ({profile['seconds']:.1f} s under the profiler), summarised by"
        " `python -m bench.collapse bench/out/profile-dtask.txt`:",
        "",
        "```",
        profile["summary"],
        "```",
        "",
    ]
    if before.exists():
        head, _, body = before.read_text().partition("\n\n")
        lines += [head, "", "```", body.rstrip(), "```", ""]
    return lines
