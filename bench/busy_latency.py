"""Latency while busy: submit -> first child started, for one-child runs submitted at a steady
pace, first on an idle cluster, then while a big run of no-op children keeps the workers
busy (issue target: p50 <= 50 ms and p99 <= 250 ms while a 100k-child run is busy).

    .venv/bin/python -m bench.busy_latency [--big 100000] [--probes 100] [--every 0.3]

One ``dtask worker -c 2`` on embedded PostgreSQL and Redis. Each probe is a ``bench_noop``
run of one child; its latency is from just before its ``dtask.submit`` call to its child's
``started_at`` in PostgreSQL (set when the child is claimed; same machine, same clock), split
at the run's ``started_at`` (its master ran) and the child's ``sent_at`` (the dispatcher
published it): what waits for the dispatcher and what waits in the broker. The
probes do not wait for each other: one leaves every ``--every`` seconds. The busy phase
starts once the big run has finished ``--flowing`` children (so its messages have their
batched size) and the big run is cancelled after the last probe; a probe sent after the big
run had finished would not measure anything busy, so the run is checked to be still going.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any

from bench.cluster import Workers, prepare_environment


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """p50/p95/p99/max (nearest rank), times ``scale`` (seconds to ms by default)."""
    ranked = sorted(values)

    def at(q: float) -> float:
        return scale * ranked[min(len(ranked) - 1, max(0, round(q * len(ranked)) - 1))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": scale * ranked[-1]}


def probe(engine: Any, count: int, every: float) -> dict[str, Any]:
    """``count`` one-child runs, one every ``every`` seconds; submit -> child started, submit
    -> run split (its master ran), submit -> child sent to the broker (``sent_at``: the
    dispatcher took it) and the submit call itself, each as percentiles (ms)."""
    from sqlalchemy import text

    import dtask

    sent: list[tuple[int, float, float]] = []  # run id, submit start, submit call seconds
    next_at = time.monotonic()
    for _ in range(count):
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += every
        start = time.time()
        run = dtask.submit("bench_noop", {"n": 1})
        sent.append((run.id, start, time.time() - start))
    ids = [i for i, _, _ in sent]
    query = text(
        "SELECT r.id, r.started_at AS split_at, min(c.sent_at) AS sent_at,"
        " min(c.started_at) AS child_at"
        " FROM dtask_runs r LEFT JOIN dtask_children c ON c.run_id = r.id"
        " WHERE r.id = ANY(:ids) GROUP BY r.id"
    )
    deadline = time.monotonic() + 120
    while True:  # every probe's child has started (or two minutes have passed)
        with engine.connect() as conn:
            rows = {r.id: r for r in conn.execute(query, {"ids": ids})}
        if all(r.child_at is not None for r in rows.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    child, split, sent_to_broker = [], [], []
    for run_id, start, _ in sent:
        row = rows[run_id]
        if row.child_at is not None:
            child.append(row.child_at.timestamp() - start)
        if row.split_at is not None:
            split.append(row.split_at.timestamp() - start)
        if row.sent_at is not None:
            sent_to_broker.append(row.sent_at.timestamp() - start)
    calls = [c for _, _, c in sent]
    return {
        "probes": count,
        "started": len(child),
        "child_ms": percentiles(child) if child else {},
        "split_ms": percentiles(split) if split else {},
        "sent_ms": percentiles(sent_to_broker) if sent_to_broker else {},
        "submit_call_ms": percentiles(calls),
        "submit_call_mean_ms": 1000 * statistics.fmean(calls),
        "run_ids": [ids[0], ids[-1]],
        "child_all_ms": sorted(1000 * c for c in child),
    }


def _finished_children(engine: Any, run_id: int) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM dtask_children WHERE run_id = :r AND state = 'succeeded'"
                ),
                {"r": run_id},
            ).scalar_one()
        )


class QueueWatch(threading.Thread):
    """Samples, every 0.25 s, how many of the big run's children are sent and not yet taken
    (in the broker or a worker's prefetch: what a probe's child queues behind), and the
    child time the dispatcher sizes its messages by."""

    def __init__(self, engine: Any, run_id: int) -> None:
        super().__init__(daemon=True)
        self.engine, self.run_id = engine, run_id
        self.stop = threading.Event()
        self.queued: list[float] = []
        self.child_seconds: float | None = None

    def run(self) -> None:
        from sqlalchemy import text

        query = text(
            "SELECT (SELECT count(*) FROM dtask_children WHERE run_id = :r"
            "   AND state = 'pending' AND sent_at IS NOT NULL) AS queued,"
            " (SELECT child_seconds FROM dtask_runs WHERE id = :r) AS child_seconds"
        )
        while not self.stop.wait(0.25):
            with self.engine.connect() as conn:
                row = conn.execute(query, {"r": self.run_id}).one()
            self.queued.append(row.queued)
            self.child_seconds = row.child_seconds


def busy(engine: Any, big: int, probes: int, every: float, flowing: int) -> dict[str, Any]:
    """The probes while a ``big``-child ``bench_noop`` run is going; the big run cancelled at
    the end. A dtask worker must be up."""
    import dtask

    run = dtask.submit("bench_noop", {"n": big})
    started = time.monotonic()
    while _finished_children(engine, run.id) < flowing:
        if time.monotonic() - started > 600:
            raise TimeoutError(f"the big run {run.id} has not got going after 10 minutes")
        time.sleep(0.2)
    before = _finished_children(engine, run.id)
    began = time.monotonic()
    watch = QueueWatch(engine, run.id)
    watch.start()
    try:
        out = probe(engine, probes, every)
    finally:
        watch.stop.set()
        watch.join()
    seconds = time.monotonic() - began
    after = _finished_children(engine, run.id)
    state = run.status().state.value
    if state == "running":
        run.cancel()
    out["big"] = {
        "run_id": run.id,
        "children": big,
        "done_before": before,
        "done_after": after,
        "children_per_s_meanwhile": (after - before) / seconds,
        "state_after_probes": state,  # "running": it was busy through every probe
        "queued": percentiles(watch.queued, 1.0) if watch.queued else {},
        "child_seconds": watch.child_seconds,
    }
    return out


def busy_latency(
    big: int, probes: int, every: float, flowing: int, concurrency: int = 2, dispatch: str = ""
) -> dict[str, Any]:
    """A fresh cluster; the idle probes, then the busy ones. ``dispatch``: DTASK_DISPATCH of
    the worker ("" for the shipped default)."""
    extra = {"DTASK_DISPATCH": dispatch} if dispatch else {}
    work = prepare_environment(**extra)
    from dtask import services
    from dtask.services import embedded

    engine = services.store().engine
    workers = Workers(work)
    result: dict[str, Any] = {"big": big, "every": every, "dispatch": dispatch or "default"}
    try:
        workers.ready(workers.dtask(concurrency))
        probe(engine, 5, every)  # warm-up: imports, connections, the worker's first tasks
        result["idle"] = probe(engine, probes, every)
        _say("idle", result["idle"])
        result["busy"] = busy(engine, big, probes, every, flowing)
        _say("busy", result["busy"])
    finally:
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    return result


def _say(phase: str, out: dict[str, Any]) -> None:
    def row(name: str, p: dict[str, float]) -> str:
        cells = " / ".join(f"{p[k]:.0f}" for k in ("p50", "p95", "p99", "max")) if p else "-"
        return f"  {name:<28} {cells}"

    print(f"{phase}: {out['started']}/{out['probes']} probes' children started;"
          " ms p50 / p95 / p99 / max", flush=True)  # fmt: skip
    print(row("submit -> first child", out["child_ms"]))
    print(row("submit -> run split", out["split_ms"]))
    print(row("submit -> child sent", out["sent_ms"]))
    print(row("submit call", out["submit_call_ms"]), flush=True)
    if "big" in out:
        b = out["big"]
        print(f"  big run {b['run_id']}: {b['done_before']:,} -> {b['done_after']:,} of"
              f" {b['children']:,} children done during the probes"
              f" ({b['children_per_s_meanwhile']:,.0f}/s), then {b['state_after_probes']}",
              flush=True)  # fmt: skip
        if b["queued"]:
            q = b["queued"]
            print(f"  its children sent, not yet taken (every 0.25 s): median"
                  f" {q['p50'] :.0f}, max {q['max']:.0f}; its child_seconds"
                  f" {b['child_seconds']}", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", type=int, default=100_000, help="children of the busy run")
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--every", type=float, default=0.3, help="seconds between probes")
    parser.add_argument(
        "--flowing", type=int, default=2000, help="big-run children done before the probes"
    )
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--dispatch", choices=["window", "all"], help="DTASK_DISPATCH (default: as shipped)"
    )
    args = parser.parse_args()
    began = time.monotonic()
    result = busy_latency(
        args.big, args.probes, args.every, args.flowing, args.concurrency, args.dispatch or ""
    )
    print(json.dumps(result, default=str))
    save(result, time.monotonic() - began, args)
    return 0


def save(result: dict[str, Any], seconds: float, args: argparse.Namespace) -> None:
    """bench/out/busy_latency.json: what docs/benchmarks.md shows (bench/report.py)."""
    from bench.cluster import REPO

    lines = [
        f"`python -m bench.busy_latency` ({args.probes} one-child runs, one every"
        f" {args.every:g} s, first while idle, then while a {args.big:,}-child no-op run keeps"
        f" the worker's {args.concurrency} pool processes busy): milliseconds from `submit()` to",
        "",
        "| | p50 | p95 | p99 | max |",
        "|:-|---:|---:|---:|---:|",
    ]
    for phase in ("idle", "busy"):
        for key, label in (("split_ms", "its split"), ("sent_ms", "its child sent"),
                           ("child_ms", "its child running")):  # fmt: skip
            p = result[phase][key]
            if p:
                lines.append(
                    f"| {phase}: {label} | {p['p50']:.0f} | {p['p95']:.0f} | {p['p99']:.0f}"
                    f" | {p['max']:.0f} |"
                )
    busy = result["busy"]
    out = {
        "seconds": seconds,
        "busy_p50_ms": busy["child_ms"].get("p50"),
        "busy_p99_ms": busy["child_ms"].get("p99"),
        "busy_ms": busy["child_all_ms"],
        "markdown": "\n".join(lines),
    }
    path = REPO / "bench" / "out" / "busy_latency.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
