"""Bulk submits: a chunk of runs of one template, client and options (they differ in key,
variables and expected children) in one transaction: the client's row locked once, the keys it
knows read in one statement, its rate limits counting every run in input order, the new runs
inserted in one statement."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from dtask.db import counters, deps
from dtask.db.clients import lock_client, rate_window
from dtask.db.run_inserts import (
    BY_KEYS,
    INSERT_MANY,
    Created,
    RunInserts,
    admitted,
    key_conflict,
    keyed,
    known,
    params,
)
from dtask.domain.bulk import Window, admit
from dtask.domain.clients import Client, refusal
from dtask.domain.runs import NewRun, RunState
from dtask.exceptions import DtaskError, RateLimited

Result = Created | DtaskError


class BulkInserts(RunInserts):
    def create_runs(self, runs: Sequence[NewRun]) -> list[Result]:
        """A bulk submit's chunk in one transaction (:func:`insert_chunk`); rate-limit
        refusals are counted with it."""
        with self.db.tx() as conn:
            results = insert_chunk(conn, runs)
            refused = sum(isinstance(r, RateLimited) for r in results)
            counters.add(conn, counters.RATE_LIMITED, refused, label=runs[0].client)
        return results

    def known_runs(self, runs: Sequence[NewRun]) -> list[Result | None]:
        """For each run, its client's run of its key as a submit of it would get it (Created,
        or KeyConflict where it asks for another template, variables or upstreams), or None
        where the key is new: what a submit refused for the backlog still answers."""
        if not runs:
            return []
        with self.db.tx() as conn:
            existing = _known_keys(conn, runs[0].client, {r.key for r in runs})
        return [
            None if (found := existing.get(run.key)) is None else _known(*found, run)
            for run in runs
        ]


def insert_chunk(conn: Connection, runs: Sequence[NewRun]) -> list[Result]:
    """For each run in input order: its run (created, or the one its client's key had
    triggered) or the error a submit of its own would have raised (KeyConflict, RateLimited).
    A key given twice gets one run (the second as a known key). The runs share the first's
    template, client, options and upstreams."""
    first = runs[0]
    client, _ = lock_client(conn, first.client)
    charged = first.charged_to(client)
    existing = _known_keys(conn, first.client, {r.key for r in runs})
    results: list[Result | None] = [None] * len(runs)
    first_of: dict[str, int] = {}
    new: list[int] = []
    for i, run in enumerate(runs):
        found = existing.get(run.key)
        if found is not None:
            results[i] = _known(*found, run)
        elif run.key not in first_of:
            first_of[run.key] = i
            new.append(i)
    admitted = []
    for i, refused in zip(new, _admit(conn, client, [runs[i] for i in new]), strict=True):
        if refused is None:
            admitted.append(i)
        else:
            results[i] = refused
    if admitted:
        created = _insert(conn, charged, [runs[i] for i in admitted])
        raced = _known_keys(conn, first.client, {runs[i].key for i in admitted} - set(created))
        for i in admitted:
            key = runs[i].key
            # not created: another submit of the key committed first
            results[i] = created[key] if key in created else _known(*raced[key], runs[i])
    for i, run in enumerate(runs):
        if results[i] is None:  # its key again: as the key's first item
            results[i] = _again(results[first_of[run.key]], runs[first_of[run.key]], run)
    return [r for r in results if r is not None]


def _insert(conn: Connection, charged: NewRun, runs: Sequence[NewRun]) -> dict[str, Created]:
    state, error = deps.initial_state(conn, charged.after)
    values = params(charged, keyed(charged, state), error)
    values["items"] = json.dumps(
        [
            {
                "key": r.key,
                "variables": r.variables,
                "expected_children": r.expected_children,
                "concurrency_key": r.concurrency_key,
            }
            for r in runs
        ]
    )
    rows = conn.execute(INSERT_MANY, values).all()
    deps.insert_many(conn, [int(r.id) for r in rows], charged.after)
    limits = {r.key: r.concurrency_key for r in runs}
    made = [
        (
            limits[str(r.trigger_key)],
            Created(int(r.id), True, RunState(r.state), float(r.starts_in), r.priority),
        )
        for r in rows
    ]
    return {
        str(r.trigger_key): created
        for r, created in zip(rows, admitted(conn, charged.client, made), strict=True)
    }


def _admit(conn: Connection, client: Client, runs: Sequence[NewRun]) -> list[RateLimited | None]:
    """Which of the new runs the client's rates admit, in order (RateLimited for the others)."""
    limits = [
        (rate, what)
        for rate, what in ((client.rate, "runs"), (client.child_rate, "children"))
        if rate is not None
    ]
    if not limits or not runs:
        return [None] * len(runs)
    windows, now = [], None
    for rate, what in limits:
        entries, now = rate_window(conn, client.name, rate, what)
        windows.append(Window(rate, entries))
    assert now is not None
    costs = [
        [1 if what == "runs" else max(1, run.expected_children or 1) for _, what in limits]
        for run in runs
    ]
    found = admit(windows, costs, now)
    return [
        None
        if r is None
        else refusal(limits[r.window][0], limits[r.window][1], cost[r.window], r.wait, client.name)
        for r, cost in zip(found, costs, strict=True)
    ]


def _known(row: Any, after: list[int], run: NewRun) -> Result:
    try:
        return known(row, after, run)
    except DtaskError as exc:
        return exc


def _again(first: Result | None, first_run: NewRun, run: NewRun) -> Result:
    """An item whose key an earlier item of the chunk gave: that item's run, as a known key
    (KeyConflict where it asks for another template or variables), or its error."""
    if not isinstance(first, Created):
        assert first is not None
        return first
    if run.template != first_run.template or run.variables != first_run.variables:
        differs = "template" if run.template != first_run.template else "variables"
        return key_conflict(run.key, first.id, [differs])
    return Created(first.id, False, first.state, first.starts_in, first.priority)


def _by_keys(conn: Connection, client: str, keys: set[str]) -> dict[str, Any]:
    if not keys:
        return {}
    rows = conn.execute(BY_KEYS, {"client": client, "keys": sorted(keys)}).all()
    return {str(r.trigger_key): r for r in rows}


def _known_keys(conn: Connection, client: str, keys: set[str]) -> dict[str, tuple[Any, list[int]]]:
    """The client's runs of ``keys``, each with its upstreams: key -> (row, upstream ids)."""
    rows = _by_keys(conn, client, keys)
    after = deps.upstreams_of_many(conn, [int(r.id) for r in rows.values()]) if rows else {}
    return {key: (row, after.get(int(row.id), [])) for key, row in rows.items()}
