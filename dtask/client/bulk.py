"""Bulk submits: ``dtask.submit_many`` (and ``Template.map``), which `dtask submit --from` and
the HTTP API's ``POST /api/v1/runs/batch`` call. Many runs of one template with the same
options, written one transaction per chunk (``MOST_PER_CHUNK``), each item's outcome in input
order: created, its key's run (known_key), invalid, refused by the client's rate limit
(limit_exceeded, with retry_after) or by a backlog cap (busy). The options are checked once,
before anything is written: a bad option refuses the whole call. A chunk's runs are committed
before their masters are sent: where the broker cannot take them, the runs stay created and
the reaper sends their masters within DTASK_STALL_TIMEOUT (nothing is lost, and the outcome
says created)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, Unpack

from dtask import services
from dtask.client import backlog
from dtask.client.runs import Prepared, prepare
from dtask.db.run_inserts import Created
from dtask.domain.bulk import MOST_PER_CHUNK, Outcome, Submitted, shown_wait
from dtask.domain.runs import NewRun, RunState
from dtask.domain.templates import RunOptions
from dtask.exceptions import BrokerUnavailable, DtaskError, InvalidVariables, RateLimited
from dtask.worker.eager import run as run_eagerly
from dtask.worker.masters import PER_MESSAGE, Master, send_masters

log = logging.getLogger("dtask.client")

# an item's variables (or the error that made them: an invalid item) and key (None: a fresh one)
Item = tuple[Mapping[str, Any] | DtaskError, str | None]


def submit_many(
    template: str,
    items: Iterable[Mapping[str, Any]],
    *,
    keys: Sequence[str | None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    **options: Unpack[RunOptions],
) -> list[Submitted]:
    """A run of ``template`` for each of ``items`` (each its variables), all with ``options``
    (those of ``dtask.submit``); ``keys[i]`` is item i's trigger key (None, or no ``keys``:
    a fresh one). Returns each item's :class:`~dtask.domain.bulk.Submitted`, in input order.
    Each chunk of up to ``MOST_PER_CHUNK`` runs is one transaction and its masters one
    pipelined send; ``on_progress(done)`` after each. Rate limits count every run, in order.
    A bad option (a ClientNotFound, an InvalidDelayTolerance, ...) raises before anything is
    written; an item's own error is its outcome."""
    if keys is not None:
        items = list(items)
        if len(keys) != len(items):
            raise InvalidVariables(f"keys: {len(keys)} keys for {len(items)} items")
        return submit_items(template, zip(items, keys, strict=True), on_progress, **options)
    return submit_items(template, ((v, None) for v in items), on_progress, **options)


def submit_items(
    template: str,
    items: Iterable[Item],
    on_progress: Callable[[int], None] | None = None,
    done: list[Submitted] | None = None,
    **options: Unpack[RunOptions],
) -> list[Submitted]:
    """:func:`submit_many` of (variables, key) pairs. Each chunk's outcomes are added to
    ``done`` (returned) as soon as the chunk is committed: a caller that sees an error later
    knows which items have their runs."""
    prepared = prepare(template, **options)
    found: list[Submitted] = [] if done is None else done
    for chunk in _chunks(items, MOST_PER_CHUNK):
        _start(prepared, _submit_chunk(prepared, chunk, found))
        if on_progress is not None:
            on_progress(len(found))
    return found


def invalid_items(
    template: str, items: Iterable[Item], **options: Unpack[RunOptions]
) -> Iterator[tuple[int, DtaskError]]:
    """Each item (its index) that :func:`submit_items` would refuse as invalid, with why;
    nothing is written. A bad option raises first, as there."""
    prepared = prepare(template, **options)
    for index, (variables, key) in enumerate(items):
        try:
            _run_of(prepared, variables, key, index)
        except DtaskError as exc:
            yield index, exc


def _run_of(prepared: Prepared, variables: Any, key: str | None, index: int) -> NewRun:
    if isinstance(variables, DtaskError):
        raise variables
    if not isinstance(variables, Mapping):
        raise InvalidVariables(
            f"item {index} is {type(variables).__name__}, not an object of variables"
        )
    return prepared.run(dict(variables), key)


def _submit_chunk(
    prepared: Prepared, chunk: list[Item], found: list[Submitted]
) -> list[tuple[Created, NewRun]]:
    """The chunk's runs written in one transaction, its outcomes added to ``found`` once it
    is committed; the runs it created, to start."""
    offset = len(found)
    outcomes: list[Submitted | None] = [None] * len(chunk)
    runs: list[NewRun] = []
    at: list[int] = []  # each run's place in the chunk
    for i, (variables, key) in enumerate(chunk):
        try:
            runs.append(_run_of(prepared, variables, key, offset + i))
            at.append(i)
        except DtaskError as exc:
            outcomes[i] = Submitted(offset + i, Outcome.INVALID, error=str(exc))
    fits, busy = (
        (len(runs), None) if prepared.eager or not runs
        else backlog.admit(runs[0], prepared.settings, len(runs))
    )  # fmt: skip
    if busy is not None:  # past the backlog cap: busy, nothing written; known keys answer
        over = services.store().runs.known_runs(runs[fits:])
        for i, known in zip(at[fits:], over, strict=True):
            outcomes[i] = (
                Submitted(offset + i, Outcome.BUSY, error=str(busy), retry_after=busy.retry_after)
                if known is None
                else _outcome(offset + i, known)
            )
        runs, at = runs[:fits], at[:fits]
    results = services.store().runs.create_runs(runs) if runs else []
    created: list[tuple[Created, NewRun]] = []
    for i, run, result in zip(at, runs, results, strict=True):
        outcomes[i] = _outcome(offset + i, result)
        if isinstance(result, Created) and result.created:
            created.append((result, run))
    found.extend(o for o in outcomes if o is not None)
    if created:
        backlog.added(runs[0], len(created))
    return created


def _outcome(index: int, result: Created | DtaskError) -> Submitted:
    if isinstance(result, Created):
        outcome = Outcome.CREATED if result.created else Outcome.KNOWN_KEY
        return Submitted(index, outcome, run_id=result.id)
    if isinstance(result, RateLimited):
        wait = shown_wait(result.retry_after)
        return Submitted(index, Outcome.LIMIT_EXCEEDED, error=str(result), retry_after=wait)
    return Submitted(index, Outcome.INVALID, error=str(result))


def _start(prepared: Prepared, created: list[tuple[Created, NewRun]]) -> None:
    """The chunk's new runs started: run here in test mode, else their masters sent (those
    due within a stall timeout; the reaper starts the others when due)."""
    if prepared.eager:
        for run, _ in created:
            run_eagerly(run.id)
        return
    due = [
        Master(run.id, new.template, run.priority, run.starts_in, f"{new.template} run {run.id}")
        for run, new in created
        if run.state is RunState.PENDING and run.starts_in <= prepared.settings.stall_timeout
    ]
    if not due:
        return
    try:
        send_masters(due, PER_MESSAGE)
    except BrokerUnavailable as exc:  # the runs are committed: nothing is lost
        log.warning(
            "%d runs submitted, their masters not sent (the reaper sends them within"
            " DTASK_STALL_TIMEOUT): %s", len(due), exc,
        )  # fmt: skip


def _chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk
