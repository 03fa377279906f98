"""Creating runs: once per trigger key of a client (two clients' keys never meet), charged to
that client, pending or waiting for the runs it was submitted after (see
:mod:`dtask.db.deps`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

from sqlalchemy import Connection, Row

from dtask.db import concurrency, counters, deps
from dtask.db.clients import check_rates, lock_client
from dtask.db.database import Database, first_row, sql
from dtask.db.run_reads import RunReads
from dtask.domain.clients import DEFAULT_CLIENT, Client
from dtask.domain.runs import NewRun, RunState
from dtask.exceptions import KeyConflict, RateLimited

_START = (
    "coalesce(CAST(:start_at AS timestamptz),"
    " clock_timestamp() + make_interval(secs => CAST(:start_in AS double precision)))"
)

# Inserts the run unless its client has a run of its key, or ``{guard}`` is false; returns what a
# submit needs
_INSERT = (
    "INSERT INTO dtask_runs"
    " (template, trigger_key, variables, max_attempts, queue, schedule, slot,"
    " execution_cap, client, priority, expected_children, created_at,"
    " delay_tolerance, on_late, deadline, tier, notify_url, notify_state, start_after,"
    " state, error, finished_at, awaits_pickup, concurrency_key, max_concurrent,"
    " trace_context)"
    " SELECT CAST(:template AS text), {key}, {variables},"
    " CAST(:max_attempts AS integer), CAST(:queue AS text), CAST(:schedule AS text),"
    " CAST(:slot AS timestamptz), CAST(:execution_cap AS double precision),"
    " CAST(:client AS text), CAST(:priority AS integer), {expected},"
    " clock_timestamp(), CAST(:delay_tolerance AS double precision), CAST(:on_late AS text),"
    " coalesce(CAST(:slot AS timestamptz), " + _START + ", clock_timestamp())"
    " + make_interval(secs => CAST(:delay_tolerance AS double precision)),"
    " CAST(:tier AS text), CAST(:notify_url AS text),"
    " CASE WHEN CAST(:notify_url AS text) IS NULL THEN NULL ELSE 'waiting' END,"
    " " + _START + ", CAST(:state AS text), CAST(:error AS text),"
    " CASE WHEN CAST(:state AS text) = 'failed' THEN clock_timestamp() END,"
    " CAST(:awaits_pickup AS boolean), {concurrency_key}, CAST(:max_concurrent AS integer),"
    " CAST(:trace_context AS jsonb)"
    "{source} WHERE {guard}"
    " ON CONFLICT (client, trigger_key) DO NOTHING RETURNING id, trigger_key, state, priority,"
    " coalesce(greatest(extract(epoch FROM start_after - clock_timestamp()), 0), 0) AS starts_in"
)
_ONE = {
    "key": "CAST(:key AS text)",
    "variables": "CAST(:variables AS jsonb)",
    "expected": "CAST(:expected_children AS integer)",
    "concurrency_key": "CAST(:concurrency_key AS text)",
    "source": "",
}
# a client's runs by trigger key: never another client's
_BY_KEY = (
    "SELECT id, trigger_key, template, variables, state, priority,"
    " coalesce(greatest(extract(epoch FROM start_after - now()), 0), 0) AS starts_in"
    " FROM dtask_runs WHERE client = :client AND trigger_key = :key"
)
BY_KEYS = sql(_BY_KEY.replace("= :key", "= ANY(CAST(:keys AS text[]))"))
_INSERT_ALWAYS = sql(_INSERT.format(guard="true", **_ONE))
# ...and many runs of one template, client and options in one statement (a bulk submit's
# chunk): their keys, variables and expected children as one JSON array
INSERT_MANY = sql(
    _INSERT.format(
        guard="true",
        key="i.key",
        variables="i.variables",
        expected="i.expected_children",
        concurrency_key="i.concurrency_key",
        source=" FROM jsonb_to_recordset(CAST(:items AS jsonb))"
        " AS i(key text, variables jsonb, expected_children integer, concurrency_key text)",
    )
)
# ...only while the client it is charged to is as the submitter last read it, unlimited: its
# row share-locked until the insert commits, so a rate limit set meanwhile waits for it (and
# a limited submit after that counts it); without a row, only ``default`` exists
_INSERT_UNLIMITED = sql(
    _INSERT.format(
        guard="coalesce((SELECT rate_count IS NULL AND child_rate_count IS NULL"
        "   AND tier IS NOT DISTINCT FROM CAST(:client_tier AS text)"
        "   AND max_priority IS NOT DISTINCT FROM CAST(:client_max_priority AS integer)"
        "   FROM dtask_clients WHERE name = CAST(:client AS text) FOR SHARE),"
        " CAST(:client_absent AS boolean))",
        **_ONE,
    )
)


@dataclass(frozen=True)
class Created:
    """A submit's run: its id, whether this submit created it (else its key existed), its
    state, the seconds until it may split (a countdown or eta) and its priority."""

    id: int
    created: bool
    state: RunState
    starts_in: float
    priority: int


_FIELDS = tuple(f.name for f in fields(NewRun))


def params(run: NewRun, state: RunState, error: str | None) -> dict[str, Any]:
    assert run.tier is not None and run.priority is not None, "a run charged to its client"
    return {
        **{name: getattr(run, name) for name in _FIELDS},  # asdict's deep copy took 20 us
        "variables": json.dumps(run.variables),
        "on_late": run.on_late.value,
        "tier": run.tier.value,
        "state": state.value,
        "error": error,
        "trace_context": json.dumps(run.trace_context) if run.trace_context else None,
    }


def insert_run(conn: Connection, run: NewRun) -> Created | None:
    """Insert a run unless its client has a run of its trigger key (exactly once per client and
    key): what was created, or None when the key was taken. It is pending, or waiting for its
    unfinished upstreams or its concurrency key, or failed at once when an upstream failed or
    was cancelled."""
    state, error = deps.initial_state(conn, run.after)
    if run.unmet is not None:
        state, error = RunState.FAILED, run.unmet
    row = conn.execute(_INSERT_ALWAYS, params(run, keyed(run, state), error)).first()
    if row is None:
        return None
    deps.insert(conn, int(row.id), run.after)
    created = Created(int(row.id), True, RunState(row.state), float(row.starts_in), row.priority)
    return admitted(conn, run.client, [(run.concurrency_key, created)])[0]


def keyed(run: NewRun, state: RunState) -> RunState:
    """A run with a concurrency key that could start is inserted waiting, for its key's
    admission (``admitted``) to decide."""
    return RunState.WAITING if run.concurrency_key and state is RunState.PENDING else state


def admitted(
    conn: Connection, client: str, created: Sequence[tuple[str | None, Created]]
) -> list[Created]:
    """The runs of ``client`` just inserted, each with its concurrency key, as their keys'
    admission leaves them: pending where their key has room, else waiting (see
    :mod:`dtask.db.concurrency`). An older run it admits instead (rare: one a concurrent
    settle held) is left pending, for the reaper to start."""
    keys = [(client, key) for key, made in created if key and made.state is RunState.WAITING]
    started = set(concurrency.admit(conn, keys))
    return [replace(c, state=RunState.PENDING) if c.id in started else c for _, c in created]


def key_conflict(key: str, run_id: int, differs: list[str]) -> KeyConflict:
    """A key's run asked for with another template, variables or upstreams (``differs``);
    the client's own run, though its variables are not shown all the same."""
    return KeyConflict(
        f"key {key!r} already triggered run {run_id} with different {' and '.join(differs)};"
        " use another key for another run"
    )


def known(existing: Row[Any], existing_after: list[int], run: NewRun) -> Created:
    """The run ``existing`` (the client's run of ``run``'s key) as a submit of ``run`` gets
    it; KeyConflict where ``run`` asks for another template, variables or upstreams."""
    differs = [
        what
        for what, same in (
            ("template", existing.template == run.template),
            ("variables", existing.variables == run.variables),
            ("upstream runs (after)", existing_after == sorted(set(run.after))),
        )
        if not same
    ]
    if differs:
        raise key_conflict(run.key, int(existing.id), differs)
    return Created(
        int(existing.id), False, RunState(existing.state), float(existing.starts_in),
        existing.priority,
    )  # fmt: skip


class RunInserts(RunReads):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.counters = counters.CounterStore(db)
        # clients as this process last read them, unlimited (see _insert_unlimited)
        self._unlimited: dict[str, Client] = {}

    def create(self, run: NewRun) -> tuple[int, bool]:
        """Insert ``run`` unless its client has a run of its key. Returns (run id, created).

        A key is the client's own: another client's run of the same key is neither returned
        nor in the way. A new run is charged to its client (RateLimited when its rate limits
        refuse it); a key the client knows returns its run and costs nothing. Its children go
        to the queue of the tier it gets (its tier, capped by the client's). With ``after``
        (existing runs' ids; UpstreamNotFound otherwise) it waits for them (see
        :mod:`dtask.db.deps`)."""
        got = self.create_run(run)
        return got.id, got.created

    def create_run(self, run: NewRun, on: Connection | None = None) -> Created:
        """:meth:`create`, with the run's state and start: what a submit needs, without
        reading the run again. ``on``: the caller's connection (:func:`dtask.db.callers.lend`),
        in whose transaction the run is written, charged and checked, in one piece as in a
        transaction of dtask's own; the caller's commit makes it a run, its rollback leaves
        none (a limited client's row stays locked until then)."""
        client, key, after = run.client, run.key, run.after
        unlimited = self._unlimited.get(client)
        if unlimited is not None and not after and on is None and not run.concurrency_key:
            created = self._insert_unlimited(run.charged_to(unlimited), unlimited)
            if created is not None:
                return created
        try:
            with self.db.tx() if on is None else self._on(on) as conn:
                existing = self._by_key(conn, client, key)
                if existing is None:
                    charged, present = lock_client(conn, client)
                    self._remember(charged, present)
                    # a submit of the same key may have committed while this one waited
                    existing = self._by_key(conn, client, key)
                if existing is None:
                    check_rates(conn, charged, run.expected_children)
                    created = insert_run(conn, run.charged_to(charged))
                    if created is not None:
                        return created
                    existing = self._by_key(conn, client, key)
                assert existing is not None
                existing_after = deps.upstreams_of(conn, existing.id)
        except RateLimited:  # counted once its transaction is rolled back
            self.counters.add(counters.RATE_LIMITED, label=client)
            raise
        return known(existing, existing_after, run)

    @contextmanager
    def _on(self, conn: Connection) -> Iterator[Connection]:
        with self.db._errors():  # the same one-line errors as its own transactions
            yield conn

    def _insert_unlimited(self, run: NewRun, client: Client) -> Created | None:
        """The submit of a new key for a client without rate limits, as one statement on an
        autocommit connection (one round trip instead of eleven): the insert happens only if
        the key is new to the client and the client is still as this process last read it (see
        ``_INSERT_UNLIMITED``). None when it did not: the caller takes the full path, which
        tells a known key, a changed client and a missing one apart."""
        values = {
            **params(run, RunState.PENDING, None),
            "client_tier": client.tier and client.tier.value,
            "client_max_priority": client.max_priority,
            "client_absent": client == Client(DEFAULT_CLIENT),
        }
        with self.db.owner() as conn:
            row = first_row(conn, _INSERT_UNLIMITED, values)
        if row is None:  # or it failed: had the insert committed, the full path finds its key
            self._unlimited.pop(client.name, None)  # read it again, in case it changed
            return None
        run_id, _, state, priority, starts_in = row
        return Created(int(run_id), True, RunState(state), float(starts_in), priority)

    def _remember(self, client: Client, present: bool) -> None:
        unlimited = client.rate is None and client.child_rate is None
        if unlimited and (present or client == Client(DEFAULT_CLIENT)):
            if len(self._unlimited) >= 1000:
                self._unlimited.clear()
            self._unlimited[client.name] = client
        else:
            self._unlimited.pop(client.name, None)

    @staticmethod
    def _by_key(conn: Connection, client: str, key: str) -> Row[Any] | None:
        """The client's run of ``key``: never another client's."""
        return conn.execute(sql(_BY_KEY), {"client": client, "key": key}).first()

    def pick_up(self, most: int) -> list[tuple[int, str, int]]:
        """The runs waiting for a pickup (``NewRun.awaits_pickup``: pending, due), ``most`` at
        most, the highest priority and oldest first, marked as picked up: (id, template,
        priority), runs of one template and priority together."""
        with self.db.tx() as conn:
            rows = conn.execute(
                sql(
                    "UPDATE dtask_runs SET awaits_pickup = false WHERE id IN ("
                    "   SELECT id FROM dtask_runs WHERE state = 'pending' AND awaits_pickup"
                    "   AND coalesce(start_after, now()) <= now()"
                    "   ORDER BY priority DESC, id LIMIT :most FOR UPDATE SKIP LOCKED)"
                    " RETURNING id, template, priority"
                ),
                {"most": most},
            ).all()
        return sorted(
            ((int(r.id), str(r.template), int(r.priority)) for r in rows),
            key=lambda r: (-r[2], r[1], r[0]),
        )

    def forget_unsent(self, run_id: int) -> bool:
        """Undo create_run when its master message could not be sent (no half-created run);
        False if a run submitted after it meanwhile keeps it (the reaper starts it later)."""
        with self.db.tx() as conn:
            gone = conn.execute(
                sql(
                    "DELETE FROM dtask_runs WHERE id = :id AND state = 'pending' AND NOT EXISTS"
                    " (SELECT 1 FROM dtask_run_deps WHERE upstream_id = :id)"
                ),
                {"id": run_id},
            )
        return gone.rowcount == 1
