"""A FastAPI app that submits with ``await dtask.asubmit`` and answers ``/ping``, served by
uvicorn in a thread of this process; a burst of submits to it from threads while another
thread pings it every 10 ms (tests/acceptance/test_async_client.py, bench/async_submit.py)."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

import dtask

PING_EVERY = 0.01


def make_app(template: str, variables: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.post("/submit/{key}")
    async def submit(key: str) -> dict[str, Any]:
        run = await dtask.asubmit(template, variables, key=key)
        return {"id": run.id, "created": run.created}

    @app.post("/submit-blocking/{key}")
    async def submit_blocking(key: str) -> dict[str, Any]:
        """What ``asubmit`` avoids: the sync submit called on the loop (a baseline)."""
        run = dtask.submit(template, variables, key=key)
        return {"id": run.id, "created": run.created}

    @app.get("/ping")
    async def ping() -> dict[str, Any]:
        return {}

    return app


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """The app on a free port of 127.0.0.1: its base URL, until the block ends."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@dataclass
class Latency:
    """Ping round trips in milliseconds."""

    samples: list[float]

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.samples)
        if not ordered:
            return {"pings": 0}
        return {
            "pings": len(ordered),
            "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max": ordered[-1],
        }

    def __str__(self) -> str:
        s = self.summary()
        if not s["pings"]:
            return "no pings"
        return (
            f"{int(s['pings'])} pings: p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms,"
            f" max {s['max']:.1f} ms"
        )


def _call(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


@contextmanager
def pinging(base: str) -> Iterator[Latency]:
    """Pings ``base``/ping every PING_EVERY seconds while the block runs."""
    latency = Latency([])
    done = threading.Event()

    def ping() -> None:
        while not done.is_set():
            sent = time.perf_counter()
            _call(f"{base}/ping")
            latency.samples.append((time.perf_counter() - sent) * 1000)
            done.wait(PING_EVERY)

    thread = threading.Thread(target=ping, name="pinger")
    thread.start()
    try:
        yield latency
    finally:
        done.set()
        thread.join(60)


def submit_all(base: str, keys: list[str], path: str = "submit") -> list[dict[str, Any]]:
    """Each key POSTed at once, one thread each: the answers, in key order."""
    with ThreadPoolExecutor(len(keys)) as pool:
        return list(pool.map(lambda k: _call(f"{base}/{path}/{k}", "POST"), keys))
