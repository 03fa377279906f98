"""Traces' hooks (dtask/tracing.py, dtask/worker/traces.py): without the OpenTelemetry API
each is the function it wraps; with the API and no SDK each calls through and reads nothing;
with an SDK they continue the context they are given. And which child messages get a span."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dtask import tracing
from dtask.domain.traces import MESSAGE_SPANS, message_attributes, stride, traced
from dtask.worker import traces

WITHOUT_API = """
import sys
sys.modules["opentelemetry"] = None  # as if dtask[otel] were not installed
from dtask import tracing
from dtask.worker import attempt, batch, finalize, tasks, traces
from dtask.client import runs

assert not tracing.installed() and not tracing.enabled() and tracing.carrier() is None
assert not hasattr(runs.submit, "__wrapped__")
assert not hasattr(tasks.run_master, "__wrapped__")
assert not hasattr(finalize.finalize_run, "__wrapped__")
write = lambda state: state
assert tracing.checkpoints(3, write) is write
with tracing.continued({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}):
    pass
print("untraced")
"""


def test_without_the_api_every_hook_is_the_function_itself() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_API], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "untraced"


def test_with_the_api_and_no_sdk_the_hooks_call_through_and_read_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not tracing.enabled() and tracing.carrier() is None
    write = lambda state: state  # noqa: E731
    assert tracing.checkpoints(3, write)({"at": 1}) == {"at": 1}  # no span: no event added

    def nothing_read(run_id: int) -> Any:
        raise AssertionError("a hook read the run with nothing to trace")

    monkeypatch.setattr(traces, "_trace_of", nothing_read)
    calls: list[tuple[Any, ...]] = []
    master = traces.master(lambda store, run_id, **kw: calls.append((run_id, kw)) or "split")
    assert master(None, 7, wait=False) == "split"
    traces.child(lambda *a: calls.append(a))("task", 7, 0, "t", {})
    traces.children(lambda *a: calls.append(a))("task", 7, "t", "g", None, [[0, {}]])
    submit = tracing.submit_span(lambda template, variables: ("run", template))
    assert submit("t", {}) == ("run", "t")
    assert calls == [
        (7, {"wait": False}),
        ("task", 7, 0, "t", {}),
        ("task", 7, "t", "g", None, [[0, {}]]),
    ]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """An SDK for this test alone (the global provider is put back afterwards)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    return exporter


def test_with_an_sdk_a_run_s_spans_continue_its_stored_context(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    incoming = {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
    with tracing.continued(incoming):
        stored = tracing.carrier()
    assert stored == incoming  # no span of ours between: the caller's own context

    from dtask.db.run_reads import Traced

    monkeypatch.setattr(traces, "_trace_of", lambda run_id: Traced(stored, 4, "t"))

    def child(task: Any, run_id: int, index: int, template: str, spec: Any) -> None:
        tracing.checkpoints(index, lambda state: None)({"done": 1})

    traces.child(child)("task", 7, 2, "t", {})
    (made,) = spans.get_finished_spans()
    assert made.name == "dtask.children"
    assert made.context is not None and made.parent is not None
    assert f"{made.context.trace_id:032x}" == "ab" * 16
    assert f"{made.parent.span_id:016x}" == "cd" * 8
    assert made.attributes is not None and made.attributes["dtask.child.indices"] == (2,)
    assert [e.name for e in made.events] == ["dtask.checkpoint"]


def test_a_refused_submit_s_span_names_the_error_never_its_text(
    spans: InMemorySpanExporter,
) -> None:
    def refused(template: str, variables: dict[str, Any]) -> None:
        raise ValueError(f"bad variables {variables}")

    with pytest.raises(ValueError):
        tracing.submit_span(refused)("t", {"password": "hunter2"})
    (made,) = spans.get_finished_spans()
    assert made.name == "dtask.submit" and not made.events
    assert made.attributes is not None and made.attributes["dtask.raised"] == "ValueError"
    assert "hunter2" not in str(made.to_json())


def test_a_million_children_one_to_a_message_make_about_message_spans_spans() -> None:
    total = 1_000_000
    assert sum(traced([i], total) for i in range(total)) == MESSAGE_SPANS
    by_100 = [traced(list(range(a, a + 100)), total) for a in range(0, total, 100)]
    assert sum(by_100) == MESSAGE_SPANS and by_100[0] and not by_100[1]
    assert all(traced(list(range(a, a + 1000)), total) for a in range(0, total, 1000))
    assert all(traced([i], 500) for i in range(500))
    assert stride(None) == stride(10) == 1 and stride(total) == 1000


def test_a_message_s_attributes_name_its_children_never_their_specs() -> None:
    shown = message_attributes(5, "t", list(range(10, 1010)), 2000)
    assert shown == {
        "dtask.run.id": 5,
        "dtask.template": "t",
        "dtask.child.first": 10,
        "dtask.child.last": 1009,
        "dtask.child.count": 1000,
        "dtask.child.sampled_every": 2,
    }  # too many to list: first, last and count
