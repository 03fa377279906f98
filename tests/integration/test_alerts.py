"""Alerts in PostgreSQL: the facts read back, one open alert per condition, closed when the
condition clears, and a monitor pass that another monitor holds is skipped."""

from __future__ import annotations

import threading
import uuid

from sqlalchemy import text

from dtask import services
from dtask.db import Refusal
from dtask.domain.alerts import Limits, evaluate
from dtask.domain.runs import NewRun
from dtask.worker import monitor

SHORT = Limits(lost_after=5, idle_after=30, stalled_after=60, misfire_shown_for=60)


def open_keys() -> set[tuple[str, str]]:
    return {(a.kind, a.subject) for a in services.store().alerts.open()}


def age(worker: str, seen: float, idle: float | None) -> None:
    with services.store().engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE dtask_workers SET seen_at = now() - make_interval(secs => :seen),"
                " idle_since = now() - make_interval(secs => :idle) WHERE name = :name"
            ),
            {"seen": seen, "idle": idle, "name": worker},
        )


def sync() -> tuple[set[str], set[str]]:
    changes = services.store().alerts.judge(
        3600, lambda facts: evaluate(facts, SHORT), SHORT.stalled_after
    )
    assert changes is not None
    return {a.subject for a in changes.opened}, {a.subject for a in changes.closed}


def test_idle_and_lost_workers_open_once_and_close_when_they_recover(
    dtask_env: dict[str, str],
) -> None:
    workers = services.store().workers
    workers.report("alert-idle@test", ["dtask"], 2, 1, busy=0)
    workers.report("alert-lost@test", ["dtask"], 2, 2, busy=1)
    age("alert-idle@test", seen=0, idle=31)
    age("alert-lost@test", seen=6, idle=None)
    opened, _ = sync()
    assert {"alert-idle@test", "alert-lost@test"} <= opened
    assert {("worker_idle", "alert-idle@test"), ("worker_lost", "alert-lost@test")} <= open_keys()
    opened, closed = sync()
    assert not ({"alert-idle@test", "alert-lost@test"} & (opened | closed))  # reported once

    workers.report("alert-idle@test", ["dtask"], 2, 1, busy=1)  # it took work
    workers.report("alert-lost@test", ["dtask"], 2, 2, busy=0)  # it came back
    _, closed = sync()
    assert {"alert-idle@test", "alert-lost@test"} <= closed
    assert not {k for k in open_keys() if k[1].startswith("alert-")}


def test_a_worker_that_took_no_child_since_it_started_counts_as_idle(
    dtask_env: dict[str, str],
) -> None:
    workers = services.store().workers
    workers.report("alert-fresh@test", ["dtask"], 1, 3, busy=0)
    age("alert-fresh@test", seen=0, idle=10)
    workers.report("alert-fresh@test", ["dtask"], 1, 3, busy=0)  # idle_since kept
    (info,) = [w for w in workers.live(60) if w.name == "alert-fresh@test"]
    assert info.idle_for is not None and info.idle_for >= 10
    workers.report("alert-fresh@test", ["dtask"], 1, 4, busy=0)  # restarted: a new pid
    (info,) = [w for w in workers.live(60) if w.name == "alert-fresh@test"]
    assert info.idle_for is not None and info.idle_for < 10
    workers.leave("alert-fresh@test")


def test_a_forgotten_worker_s_alert_closes(dtask_env: dict[str, str]) -> None:
    services.store().workers.report("alert-forgotten@test", ["dtask"], 1, 5, busy=0)
    age("alert-forgotten@test", seen=100, idle=100)
    sync()
    assert ("worker_lost", "alert-forgotten@test") in open_keys()
    changes = services.store().alerts.judge(
        50, lambda facts: evaluate(facts, SHORT), SHORT.stalled_after
    )
    assert changes is not None and "alert-forgotten@test" in {a.subject for a in changes.closed}
    assert "alert-forgotten@test" not in {w.name for w in services.store().workers.live(10**6)}


def test_a_pass_while_another_monitor_holds_the_lock_is_skipped(
    dtask_env: dict[str, str],
) -> None:
    from dtask.db.alerts import MONITOR_LOCK

    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with services.store().engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MONITOR_LOCK})
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        assert services.store().alerts.sync([]) is None
        read: list[object] = []
        assert services.store().alerts.judge(3600, lambda f: read.append(f) or [], 600) is None
        assert read == []  # the facts are not even read
        assert monitor.once() == 1  # skipped, not failed
    finally:
        release.set()
        holder.join()


def test_a_run_is_stalled_when_nothing_of_it_changed_for_the_limit(
    dtask_env: dict[str, str],
) -> None:
    store = services.store()
    run_id, _ = store.runs.create(NewRun("t", f"test:{uuid.uuid4()}", {}, 1, None))
    assert store.runs.split(run_id, lambda run, slots: [{"i": i} for i in range(3)]) is not None
    store.runs.dispatch(run_id, lambda run, kids: None)

    def quiet(run_for: float, children_for: float) -> None:
        with store.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE dtask_runs SET updated_at = now() - make_interval(secs => :s),"
                    " started_at = now() - make_interval(secs => :s),"
                    " created_at = now() - make_interval(secs => :s) WHERE id = :id"
                ),
                {"s": run_for, "id": run_id},
            )
            conn.execute(
                text(
                    "UPDATE dtask_children SET updated_at = now() - make_interval(secs => :s)"
                    " WHERE run_id = :id"
                ),
                {"s": children_for, "id": run_id},
            )

    def stalled() -> bool:
        sync()
        return ("run_stalled", str(run_id)) in open_keys()

    try:
        quiet(3600, 3600)
        assert stalled()
        claim = store.children.claim(run_id, 0, "alerts@test", 60)  # a child runs: it moves
        assert not isinstance(claim, Refusal)
        assert not stalled()
        quiet(3600, 3600)  # a running child long quiet, and nothing else: stalled again
        assert stalled()
        with store.engine.begin() as conn:  # another child changed 10 s ago: it moves
            conn.execute(
                text(
                    "UPDATE dtask_children SET updated_at = now() - interval '10 s'"
                    " WHERE run_id = :id AND index = 2"
                ),
                {"id": run_id},
            )
        assert not stalled()
    finally:
        store.runs.cancel(run_id)
        sync()
