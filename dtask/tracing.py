"""OpenTelemetry traces of runs (docs/traces.md), on the OpenTelemetry API alone
(``dtask[otel]``). Without the API installed every hook here is the function it wraps, or
returns at once; with it but no SDK configured (the API's proxy tracer provider), each hook
costs one ``isinstance``. The application configures the SDK (its exporter, its sampler)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

from dtask.domain.runs import NewRun
from dtask.domain.traces import CHECKPOINT, SLOT, SUBMIT

P = ParamSpec("P")
R = TypeVar("R")

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, StatusCode
except ImportError:  # dtask without [otel]: nothing to trace
    trace = None  # type: ignore[assignment]

Attributes = Mapping[str, Any]
NAME = "dtask"


def installed() -> bool:
    return trace is not None


def enabled() -> bool:
    """Whether spans go anywhere: the API is installed and an SDK's provider is set."""
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers (``traceparent``, ``tracestate``), to store
    with a run; None where nothing is traced."""
    if not enabled():
        return None
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers or None


def submit_span(function: Callable[P, R]) -> Callable[P, R]:
    """``submit`` in a ``dtask.submit`` span (its run's context is captured inside it): the
    template, client and run id as attributes."""
    if trace is None:
        return function

    @functools.wraps(function)
    def traced(*args: P.args, **kwargs: P.kwargs) -> R:
        if not enabled():
            return function(*args, **kwargs)
        shown = {"dtask.template": str(args[0] if args else kwargs.get("template"))}
        shown["dtask.client"] = str(kwargs.get("client") or "default")
        tracer = trace.get_tracer(NAME)
        with tracer.start_as_current_span(
            SUBMIT,
            kind=SpanKind.PRODUCER,
            attributes=shown,
            record_exception=False,  # its text may hold a variable's value
            set_status_on_exception=False,
        ) as span:
            try:
                run = function(*args, **kwargs)
            except BaseException as exc:
                span.set_attribute("dtask.raised", type(exc).__name__)
                span.set_status(StatusCode.ERROR)
                raise
            span.set_attribute("dtask.run.id", int(getattr(run, "id", 0)))
            span.set_attribute("dtask.run.created", bool(getattr(run, "created", True)))
            return run

    return traced


def started(name: str, attributes: Attributes) -> dict[str, str] | None:
    """A span ``name`` that ends at once, in the current trace (a new one where none is
    current), as W3C headers: the parent of the work it starts elsewhere (a schedule's slot
    fired by a beat or a backfill); None where nothing is traced."""
    if not enabled():
        return None
    tracer = trace.get_tracer(NAME)
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes):
        return carrier()


def slot_runs(runs: list[NewRun]) -> list[NewRun]:
    """A schedule's slot runs, each with the context of a ``dtask.slot`` span of its own
    (untouched where nothing is traced)."""
    if not enabled():
        return runs
    return [
        replace(
            run,
            trace_context=started(
                SLOT, {"dtask.schedule": str(run.schedule), "dtask.slot": str(run.slot)}
            ),
        )
        for run in runs
    ]


@contextmanager
def continued(headers: Mapping[str, str] | None) -> Iterator[None]:
    """The trace context ``headers`` hold (an HTTP request's ``traceparent``) made current."""
    if not headers or not enabled():
        yield
        return
    token = otel_context.attach(propagate.extract(dict(headers)))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def span(
    name: str, headers: Mapping[str, str], attributes: Attributes, current: bool = True
) -> Iterator[Any]:
    """A span ``name`` (a consumer's) in the trace ``headers`` hold (a run's stored context).
    An exception is said as its class's name, never its text (which may hold values)."""
    parent = propagate.extract(dict(headers))
    tracer = trace.get_tracer(NAME)
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
        end_on_exit=True,
    ) as made:
        try:
            yield made
        except BaseException as exc:
            made.set_attribute("dtask.raised", type(exc).__name__)
            raise


def ended_span(name: str, headers: Mapping[str, str], attributes: Attributes, began: int) -> None:
    """A span that began at ``began`` (``time.time_ns()``) and ends now: something known to
    deserve a span only once it is over (the finalize that ended its run)."""
    parent = propagate.extract(dict(headers))
    made = trace.get_tracer(NAME).start_span(
        name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes, start_time=began
    )
    made.end()


def now() -> int:
    return time.time_ns()


def checkpoints(index: int, write: Callable[[Any], R]) -> Callable[[Any], R]:
    """``write`` (a child's checkpoint) that also adds a ``dtask.checkpoint`` event to the
    current span (its message's), once the checkpoint is written, where spans go anywhere:
    asked at each checkpoint, not for each child (a child of a millisecond has none)."""
    if trace is None:
        return write

    def written(state: Any) -> R:
        done = write(state)
        if enabled():
            trace.get_current_span().add_event(CHECKPOINT, {"dtask.child.index": index})
        return done

    return written
