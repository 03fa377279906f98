"""The trace of one large run (docs/traces.md): its spans per kind, their depth, how many
children the child-message spans name, the checkpoint events, against real workers (2 worker
processes of 2 pool processes each) whose spans are written as JSON lines
(tests/support/traces.py), and this process's submit span in memory.

    .venv/bin/python -m bench.traces [--children 10000]

Template ``traced_range`` (10 items a child, a checkpoint every 5). Prints a summary and one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from typing import Any

from bench.cluster import Workers, prepare_environment


def _depth(spans: dict[str, dict[str, Any]], span: dict[str, Any]) -> int:
    depth = 1
    while span["parent_id"] in spans:
        span, depth = spans[span["parent_id"]], depth + 1
    return depth


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=10_000)
    args = parser.parse_args()
    work = prepare_environment()
    folder = work / "traces"
    folder.mkdir()
    os.environ["DTASK_TEMPLATES"] = "bench.templates,tests.support.traced"
    os.environ["DTASK_TEST_TRACES"] = str(folder)
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import dtask
    from dtask import services
    from tests.support.traces import as_dict, read

    here = InMemorySpanExporter()  # this process: install_from_env's provider is replaced
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(here))
    trace.set_tracer_provider(provider)
    services.store()
    workers = Workers(work)
    try:
        for _ in range(2):
            workers.dtask(2)
        workers.ready()
        began = time.monotonic()
        run = dtask.submit("traced_range", {"n": 10 * args.children})
        state = run.wait(timeout=1800).state
        wall = time.monotonic() - began
        submit = as_dict(here.get_finished_spans()[0])
        deadline = time.monotonic() + 120
        while True:
            spans = [s for s in read(folder) if s["trace_id"] == submit["trace_id"]]
            if any(s["name"] == "dtask.finalize" for s in spans) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        workers.stop_all()
    spans.append(submit)
    by_id = {s["span_id"]: s for s in spans}
    messages = [s for s in spans if s["name"] == "dtask.children"]
    named = sum(s["attributes"]["dtask.child.count"] for s in messages)
    result = {
        "children": args.children,
        "state": str(state),
        "wall_s": round(wall, 1),
        "spans": len(spans),
        "per_kind": dict(Counter(s["name"] for s in spans)),
        "depth": max(_depth(by_id, s) for s in spans),
        "parents": dict(Counter(by_id[s["parent_id"]]["name"] for s in spans if s["parent_id"])),
        "children_in_traced_messages": named,
        "children_per_message": round(named / max(len(messages), 1), 1),
        "checkpoint_events": sum(len(s["events"]) for s in messages),
        "processes": len({s["pid"] for s in spans}),
        "trace_ids": len({s["trace_id"] for s in spans}),
    }
    for name, value in result.items():
        print(f"{name:>28}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
