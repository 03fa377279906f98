"""Alerts in PostgreSQL: the facts read back, one open alert per condition, closed when the
condition clears, and a monitor pass that another monitor holds is skipped."""

from __future__ import annotations

import threading

from sqlalchemy import text

from dtask import services
from dtask.domain.alerts import Limits, evaluate
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
    changes = services.store().alerts.judge(3600, lambda facts: evaluate(facts, SHORT))
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
    changes = services.store().alerts.judge(50, lambda facts: evaluate(facts, SHORT))
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
        assert services.store().alerts.judge(3600, lambda f: read.append(f) or []) is None
        assert read == []  # the facts are not even read
        assert monitor.once() == 1  # skipped, not failed
    finally:
        release.set()
        holder.join()
