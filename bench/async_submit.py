"""Event-loop latency while an ASGI app submits (issue 43): a FastAPI app served by uvicorn in
a process of its own (tests/support/asgi_submits.py) gets ``--runs`` POSTs at once, each
``await dtask.asubmit(...)``, while this process pings its ``/ping`` every 10 ms. The ping's
round trip (p50, p99, max) idle, during the burst, and during the same burst through an
``async def`` endpoint that calls the sync ``dtask.submit`` on the loop (what asubmit avoids).

    .venv/bin/python -m bench.async_submit [--runs 100] [--rounds 3]

Embedded PostgreSQL and Redis under a fresh DTASK_HOME; no worker (the runs stay pending: a
submit's cost is what is measured). Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.cluster import prepare_environment

TEMPLATE, VARIABLES = "bench_noop", {"n": 1}


def serve() -> None:
    """The app's process: prints its URL, serves until stdin closes."""
    from tests.support.asgi_submits import make_app, served

    with served(make_app(TEMPLATE, VARIABLES)) as base:
        print(base, flush=True)
        sys.stdin.read()


def measure(base: str, path: str, runs: int) -> dict[str, Any]:
    from tests.support.asgi_submits import pinging, submit_all

    keys = [f"bench-{uuid.uuid4().hex}-{i}" for i in range(runs)]
    with pinging(base) as latency:
        began = time.monotonic()
        answers = submit_all(base, keys, path)
        took = time.monotonic() - began
    assert len({a["id"] for a in answers}) == runs and all(a["created"] for a in answers)
    return {**latency.summary(), "submits_per_second": runs / took}


def idle(base: str, pings: int) -> dict[str, Any]:
    from tests.support.asgi_submits import pinging

    with pinging(base) as latency:
        while len(latency.samples) < pings:
            time.sleep(0.05)
    return latency.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    prepare_environment()
    from dtask import services

    services.store()  # the embedded services started and migrated before the app starts
    app = subprocess.Popen(
        [sys.executable, "-m", "bench.async_submit", "--serve"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert app.stdout is not None
        base = app.stdout.readline().strip()
        from tests.support.asgi_submits import submit_all

        submit_all(base, [f"warm-{uuid.uuid4().hex}"])  # imports, connections, the broker
        submit_all(base, [f"warm-{uuid.uuid4().hex}"], "submit-blocking")
        rows: dict[str, list[dict[str, Any]]] = {"idle": [], "asubmit": [], "blocking": []}
        for _ in range(args.rounds):
            rows["idle"].append(idle(base, 100))
            rows["asubmit"].append(measure(base, "submit", args.runs))
            rows["blocking"].append(measure(base, "submit-blocking", args.runs))
    finally:
        if app.stdin is not None:
            app.stdin.close()
        app.wait(30)
    report(rows, args.runs)


def report(rows: dict[str, list[dict[str, Any]]], runs: int) -> None:
    names = {
        "idle": "idle",
        "asubmit": f"{runs} concurrent `await dtask.asubmit`",
        "blocking": f"{runs} concurrent sync `dtask.submit` in `async def`",
    }
    print("| ping every 10 ms | p50 ms | p99 ms | max ms | submits/s |")
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for name, found in rows.items():
        med = {k: sorted(r[k] for r in found)[len(found) // 2] for k in ("p50", "p99", "max")}
        rate = [r["submits_per_second"] for r in found if "submits_per_second" in r]
        per_s = f"{sorted(rate)[len(rate) // 2]:.0f}" if rate else "-"
        figures = " | ".join(f"{med[k]:.1f}" for k in ("p50", "p99", "max"))
        print(f"| {names[name]} | {figures} | {per_s} |")
        summary[name] = {**med, "submits_per_second": rate}
    print("(median of the rounds' figures)")
    print(json.dumps({"async_submit": summary}))


if __name__ == "__main__":
    main()
