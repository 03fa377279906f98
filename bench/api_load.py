"""Load on one `dtask serve`: 200 concurrent long polls and 50 submits a second for 60 s, with
reads of single runs on the side, against embedded PostgreSQL and Redis and 2 dtask workers.

    python -m bench.api_load [--seconds 60] [--polls 200] [--rate 50]

Prints each operation's count, errors and latency (p50, p95, p99); docs/monitoring.md quotes
them. The load comes from one asyncio process (aiohttp: httpx spent a whole core on its own at
this load), the server is its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def ok(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def failed(self, why: str) -> None:
        self.errors[why] = self.errors.get(why, 0) + 1

    def row(self, name: str) -> str:
        xs = sorted(self.latencies)
        if not xs:
            return f"| {name} | 0 | {self.errors} | - | - | - |"
        q = statistics.quantiles(xs, n=100, method="inclusive")
        errors = sum(self.errors.values())
        shown = f"{errors} {self.errors}" if errors else "0"
        return (
            f"| {name} | {len(xs):,} | {shown} | {q[49] * 1000:.0f} ms | {q[94] * 1000:.0f} ms"
            f" | {q[98] * 1000:.0f} ms |"
        )


READERS = 5  # each reads one recent run every 0.1 s


async def _load(
    base: str, token: str, seconds: float, polls: int, rate: float, wait: float
) -> dict[str, Tally]:
    import aiohttp

    polled = f"GET /runs/{{id}}?wait={wait:g}"
    tallies = {k: Tally() for k in ("POST /runs", "GET /runs/{id}", polled)}
    runs: list[int] = []
    stop = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=polls + 50)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout) as http:

        async def call(kind: str, method: str, path: str, **kw: object) -> Any:
            began = time.monotonic()
            try:
                async with http.request(method, base + path, **kw) as reply:  # type: ignore[arg-type]
                    body = await reply.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                tallies[kind].failed(type(exc).__name__)
                return None
            if reply.status >= 400:
                tallies[kind].failed(str(reply.status))
                return None
            tallies[kind].ok(time.monotonic() - began)
            return body

        async def submitter() -> None:
            sent, began = 0, time.monotonic()
            body = {"template": "bench_noop", "variables": {"n": 1}}
            pending: set[asyncio.Task[None]] = set()

            async def one() -> None:
                reply = await call("POST /runs", "POST", "/runs", json=body)
                if reply is not None:
                    runs.append(reply["id"])

            while time.monotonic() < stop:
                task = asyncio.create_task(one())
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
                await asyncio.sleep(max(0.0, began + sent / rate - time.monotonic()))
            await asyncio.gather(*pending)

        async def poller() -> None:
            while time.monotonic() < stop:
                if not runs:
                    await asyncio.sleep(0.05)
                    continue
                await call(polled, "GET", f"/runs/{runs[-1]}?wait={wait:g}")

        async def reader() -> None:
            while time.monotonic() < stop:
                if runs:
                    await call("GET /runs/{id}", "GET", f"/runs/{random.choice(runs[-500:])}")
                await asyncio.sleep(0.1)

        await asyncio.gather(
            submitter(), *(reader() for _ in range(READERS)), *(poller() for _ in range(polls))
        )
    return tallies


def _states(services: Any) -> dict[Any, int]:
    from dtask.domain.runs import RunState

    found: dict[Any, int] = {}
    for status in services.store().runs.statuses(limit=100_000):
        found[status.state] = found.get(status.state, 0) + 1
    return {s: found[s] for s in RunState if s in found}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_load")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50, help="submits a second")
    parser.add_argument("--workers", type=int, default=2, help="dtask workers (1 process each)")
    parser.add_argument("--wait", type=float, default=30, help="each long poll's ?wait=")
    args = parser.parse_args()

    work = prepare_environment()
    from dtask import services
    from dtask.client.tokens import create_token
    from dtask.local.stack import free_port
    from dtask.services import embedded

    services.store()
    _, secret = create_token("default", admin=True)
    workers = Workers(work)
    for _ in range(args.workers):
        workers.dtask(1)
    port = free_port(8000)
    log = work / "serve.log"
    dtask_bin = str(Path(sys.executable).with_name("dtask"))
    with log.open("wb") as out:
        argv = [dtask_bin, "serve", "--port", str(port)]
        server = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )
    try:
        if args.workers:
            workers.ready()
        while "Uvicorn running on" not in log.read_text(errors="replace"):
            if server.poll() is not None:
                raise SystemExit(f"dtask serve did not start: see {log}")
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}/api/v1"
        print(
            f"load: {args.polls} long polls (wait={args.wait:g}), {args.rate:g} submits/s,"
            f" {READERS} readers, {args.seconds:g} s, {args.workers} workers"
        )
        began = time.monotonic()
        tallies = asyncio.run(_load(base, secret, args.seconds, args.polls, args.rate, args.wait))
        wall = time.monotonic() - began
        states = {s.value: n for s, n in _states(services).items()}
    finally:
        server.terminate()
        server.wait(30)
        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    submitted = len(tallies["POST /runs"].latencies)
    print(
        f"\n{submitted:,} runs submitted in {args.seconds:g} s ({submitted / args.seconds:.1f}/s);"
        f" the last long polls answered {wall - args.seconds:.0f} s later; runs by state at the"
        f" end: {states}\n"
    )
    print("| request | answered | errors | p50 | p95 | p99 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, tally in tallies.items():
        print(tally.row(name))
    errors = len(re.findall(r"Traceback|ERROR", log.read_text(errors="replace")))
    print(f"\nserver log: {errors} errors ({log})")
    return 0 if not any(t.errors for t in tallies.values()) and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
