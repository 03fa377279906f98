"""OpenTelemetry traces of runs against real workers (docs/traces.md): one trace from the
submit to the finalize, with parent links right, across the submitting process and the
workers' pool processes; and a submit through the HTTP API continues its ``traceparent``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import dtask
import tests.support.traced  # noqa: F401  # traced_range, known to this process too
from tests.conftest import WorkerProcess, running_workers
from tests.support.api import call, start_server, token
from tests.support.db import wait_for
from tests.support.traces import FOLDER, as_dict, read

pytestmark = pytest.mark.acceptance

Span = dict[str, Any]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def traced_env(dtask_env: dict[str, str], traces: Path) -> dict[str, str]:
    templates = f"{dtask_env['DTASK_TEMPLATES']},tests.support.traced"
    return {**dtask_env, "DTASK_TEMPLATES": templates, FOLDER: str(traces)}


@pytest.fixture(scope="module")
def traced_workers(
    traced_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    logs = tmp_path_factory.mktemp("traced-workers")
    with running_workers(traced_env, logs, 2, "-c", "2") as started:
        yield started


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """This process's spans, in memory, for this test alone (the global provider is put back
    afterwards: no other test of the session traces)."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    return spans


def _of_trace(traces: Path, trace_id: str, finalized: int, children: int = 0) -> list[Span]:
    """The workers' spans of the trace, once the finalize of run ``finalized`` is among them
    and its messages' spans name ``children`` children: each process writes its own spans as
    they end, and a message that ended before the finalize may be written after it."""

    def found() -> list[Span]:
        spans = [s for s in read(traces) if s["trace_id"] == trace_id]
        done = any(
            s["name"] == "dtask.finalize" and s["attributes"]["dtask.run.id"] == finalized
            for s in spans
        )
        named = {
            i
            for s in spans
            if s["name"] == "dtask.children"
            for i in s["attributes"]["dtask.child.indices"]
        }
        return spans if done and len(named) >= children else []

    return wait_for(found, 60, f"the finalize span of run {finalized}")  # type: ignore[no-any-return]


def _one(spans: list[Span], name: str) -> Span:
    named = [s for s in spans if s["name"] == name]
    assert len(named) == 1, (name, named)
    return named[0]


def test_one_trace_from_submit_to_finalize_across_worker_processes(
    traced_workers: list[WorkerProcess], traces: Path, exporter: InMemorySpanExporter
) -> None:
    with trace.get_tracer("test").start_as_current_span("request"):
        run = dtask.submit("traced_range", {"n": 95}, client="default")
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED

    here = [as_dict(s) for s in exporter.get_finished_spans()]
    request, submit = _one(here, "request"), _one(here, "dtask.submit")
    assert submit["parent_id"] == request["span_id"]
    assert submit["attributes"] == {
        "dtask.template": "traced_range",
        "dtask.client": "default",
        "dtask.run.id": run.id,
        "dtask.run.created": True,
    }
    trace_id = submit["trace_id"]
    spans = _of_trace(traces, trace_id, run.id, children=10)
    assert {s["pid"] for s in spans}.isdisjoint({os.getpid()})

    master = _one(spans, "dtask.master")
    assert master["parent_id"] == submit["span_id"]
    assert master["attributes"]["dtask.run.state"] == "running"
    # one, unless two finalizers raced (two last messages at once): each then says so
    finals = [s for s in spans if s["name"] == "dtask.finalize"]
    for finalize in finals:
        assert finalize["parent_id"] == master["span_id"]
        assert finalize["attributes"] == {"dtask.run.id": run.id, "dtask.run.state": "succeeded"}

    messages = [s for s in spans if s["name"] == "dtask.children"]
    assert messages and all(m["parent_id"] == master["span_id"] for m in messages)
    indices = sorted(i for m in messages for i in m["attributes"]["dtask.child.indices"])
    assert indices == list(range(10))  # 95 items, 10 to a child: every child in one message
    for m in messages:
        shown = m["attributes"]
        assert shown["dtask.run.id"] == run.id and shown["dtask.template"] == "traced_range"
        assert shown["dtask.child.count"] == len(shown["dtask.child.indices"])
        assert shown["dtask.child.first"] == shown["dtask.child.indices"][0]
    checkpoints = [e for m in messages for e in m["events"] if e["name"] == "dtask.checkpoint"]
    # each child of 10 items checkpoints after its 5th (the 10th is its finish)
    assert {e["attributes"]["dtask.child.index"] for e in checkpoints} == set(range(10))
    assert len({s["span_id"] for s in spans}) == len(spans)
    # nothing else: the submit's trace is the run's alone
    assert {s["name"] for s in spans} == {"dtask.master", "dtask.children", "dtask.finalize"}


def test_a_submit_through_the_api_continues_its_traceparent(
    traced_workers: list[WorkerProcess],
    traced_env: dict[str, str],
    traces: Path,
    tmp_path: Path,
) -> None:
    server, base = start_server(traced_env, tmp_path / "serve.log")
    try:
        trace_id, parent = uuid.uuid4().hex, uuid.uuid4().hex[:16]
        body = {"template": "traced_range", "variables": {"n": 30}}
        reply = call(
            base, "POST", "/runs", token(traced_env, "default"), body,
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )  # fmt: skip
        assert reply.status == 201, reply.body
        run_id = int(reply.body["id"])
        spans = _of_trace(traces, trace_id, run_id)
    finally:
        server.stop()
    submit = _one(spans, "dtask.submit")
    assert submit["parent_id"] == parent
    assert submit["attributes"]["dtask.run.id"] == run_id
    master = _one(spans, "dtask.master")
    finals = [s for s in spans if s["name"] == "dtask.finalize"]
    assert master["parent_id"] == submit["span_id"]
    assert finals and all(f["parent_id"] == master["span_id"] for f in finals)
    assert master["pid"] != submit["pid"]  # the server's process, then a worker's


def test_a_run_submitted_untraced_makes_no_span(
    traced_workers: list[WorkerProcess], traces: Path
) -> None:
    run = dtask.submit("traced_range", {"n": 20})
    assert run.wait(timeout=120).state is dtask.RunState.SUCCEEDED
    ids = {s["attributes"].get("dtask.run.id") for s in read(traces) if s["name"] != "dtask.submit"}
    assert run.id not in ids


def test_a_backfilled_slot_s_run_is_traced_under_its_slot_span(
    traced_workers: list[WorkerProcess], traces: Path, exporter: InMemorySpanExporter
) -> None:
    name = f"traced-{uuid.uuid4().hex[:8]}"
    dtask.add_schedule(name, "traced_range", {"n": 20}, cron="0 2 * * *", tz="UTC")
    start = datetime(2026, 3, 1, tzinfo=UTC)
    done = dtask.backfill_schedule(name, start, start + timedelta(days=1, hours=3))
    assert done.created == 2
    here = sorted(
        (as_dict(s) for s in exporter.get_finished_spans() if s.name == "dtask.slot"),
        key=lambda s: str(s["attributes"]["dtask.slot"]),
    )
    assert [s["attributes"]["dtask.slot"] for s in here] == [
        "2026-03-01 02:00:00+00:00",
        "2026-03-02 02:00:00+00:00",
    ]
    assert all(s["attributes"]["dtask.schedule"] == name for s in here)
    assert len({s["trace_id"] for s in here}) == 2  # a trace per slot
    for slot, run_id in zip(here, done.run_ids, strict=True):
        assert dtask.get_run(run_id).wait(timeout=120).state is dtask.RunState.SUCCEEDED
        spans = _of_trace(traces, slot["trace_id"], run_id)
        assert _one(spans, "dtask.master")["parent_id"] == slot["span_id"]
