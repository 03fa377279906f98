"""The worker's side of a run's trace (dtask/tracing.py): its master, each message of its
children (about ``MESSAGE_SPANS`` a run at most) and the finalize that ended it, each a span in
the trace of the run's submit, whose context PostgreSQL keeps with the run. Each hook wraps its
function; where nothing is traced it calls it at once, and reads nothing."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from dtask import services, tracing
from dtask.db.run_reads import Traced
from dtask.domain.runs import RunState
from dtask.domain.traces import CHILDREN, FINALIZE, MASTER, message_attributes, traced

P = ParamSpec("P")
R = TypeVar("R")

_known: dict[int, Traced] = {}  # run id: its context, children, template
KNOWN = 1000  # runs whose context a process keeps


def _trace_of(run_id: int) -> Traced:
    """The run's stored trace context and its children's count, read once a process where its
    split is done (a run submitted untraced has no context: none of its work is traced)."""
    found = _known.get(run_id)
    if found is None:
        found = services.store().runs.trace_of(run_id)
        if found.children is not None:
            if len(_known) >= KNOWN:
                _known.clear()
            _known[run_id] = found
    return found


def master(
    function: Callable[Concatenate[Any, int, P], R],
) -> Callable[Concatenate[Any, int, P], R]:
    """``run_master`` in a ``dtask.master`` span: the split and the dispatch (and a one-child
    run's child taken inline, whose checkpoints are its events). The run's stored context
    becomes the master's, so its children's messages and its finalize are the master's
    children in the trace (a rerun's new master takes them over)."""
    if not tracing.installed():
        return function

    @functools.wraps(function)
    def spanned(store: Any, run_id: int, /, *args: P.args, **kwargs: P.kwargs) -> R:
        run = _trace_of(run_id) if tracing.enabled() else None
        if run is None or run.context is None:
            return function(store, run_id, *args, **kwargs)
        shown = {"dtask.run.id": run_id, "dtask.template": run.template}
        with tracing.span(MASTER, run.context, shown) as made:
            # before the split commits: its children's messages and the finalize read it
            store.runs.trace_under(run_id, tracing.carrier())
            state = function(store, run_id, *args, **kwargs)
            made.set_attribute("dtask.run.state", str(getattr(state, "value", state)))
            return state

    return spanned


def _message(run_id: int, template: str, indices: list[int], call: Callable[[], None]) -> None:
    run = _trace_of(run_id) if tracing.enabled() else None
    if run is None or run.context is None or not traced(indices, run.children):
        call()
        return
    shown = message_attributes(run_id, template, indices, run.children)
    with tracing.span(CHILDREN, run.context, shown):
        call()


def child(function: Callable[..., None]) -> Callable[..., None]:
    """A ``dtask.child`` message in a ``dtask.children`` span of its one child."""
    if not tracing.installed():
        return function

    @functools.wraps(function)
    def spanned(task: Any, run_id: int, index: int, template: str, spec: Any) -> None:
        call = functools.partial(function, task, run_id, index, template, spec)
        _message(run_id, template, [index], call)

    return spanned


def children(function: Callable[..., None]) -> Callable[..., None]:
    """A ``dtask.children`` message in one span, its children's indices as attributes."""
    if not tracing.installed():
        return function

    @functools.wraps(function)
    def spanned(
        task: Any, run_id: int, template: str, group_id: str, queue: str | None, items: Any
    ) -> None:
        call = functools.partial(function, task, run_id, template, group_id, queue, items)
        _message(run_id, template, [int(i) for i, _ in items], call)

    return spanned


def finalize(
    function: Callable[Concatenate[Any, int, P], RunState],
) -> Callable[Concatenate[Any, int, P], RunState]:
    """``finalize_run``: a ``dtask.finalize`` span where the call ended its run (several
    finalizers may ask, the last child and the chord callback among them: only the one that
    found it unfinished and left it finished has one)."""
    if not tracing.installed():
        return function

    @functools.wraps(function)
    def spanned(store: Any, run_id: int, /, *args: P.args, **kwargs: P.kwargs) -> RunState:
        if not tracing.enabled():
            return function(store, run_id, *args, **kwargs)
        headers = _trace_of(run_id).context
        before = services.store().runs.state_of(run_id) if headers is not None else None
        began = tracing.now()
        state = function(store, run_id, *args, **kwargs)
        if headers is not None and before is not None and not before.finished and state.finished:
            shown = {"dtask.run.id": run_id, "dtask.run.state": state.value}
            tracing.ended_span(FINALIZE, headers, shown, began)
        return state

    return spanned
