"""Spans out of real worker processes: with DTASK_TEST_TRACES set (a folder), a process that
imports this module (its templates: tests/support/traced.py) gets an SDK tracer provider whose
finished spans are written, one JSON line each, to ``<folder>/<pid>.jsonl``; ``read`` gathers
every process's."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

FOLDER = "DTASK_TEST_TRACES"


class JsonLines(SpanExporter):
    """Each span as a JSON line in its process's own file (opened per export: fork-safe)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with (self.folder / f"{os.getpid()}.jsonl").open("a") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "attributes": dict(span.attributes or {}),
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
        "pid": os.getpid(),
    }


def install_from_env() -> None:
    folder = os.environ.get(FOLDER)
    if folder:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLines(Path(folder))))
        trace.set_tracer_provider(provider)


def read(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(folder.glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
