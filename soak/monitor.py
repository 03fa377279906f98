"""Watches the cluster from outside: PostgreSQL polled for children and runs (fences seen,
progress, final states), worker RSS sampled, and each injected fault's recovery timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psutil
from sqlalchemy import text

from dtask import services
from soak.cluster import Cluster

ChildKey = tuple[int, int]


@dataclass(frozen=True)
class ChildObs:
    state: str
    fence: int
    attempt: int
    max_attempts: int
    owner: str | None
    done: int

    @property
    def owner_pid(self) -> int | None:
        return int(self.owner.rsplit(":", 1)[1]) if self.owner else None


@dataclass(frozen=True)
class RunObs:
    state: str
    template: str
    schedule: str | None
    slot: datetime | None
    error: str | None
    created_at: datetime


@dataclass
class Snapshot:
    at: float = 0.0
    children: dict[ChildKey, ChildObs] = field(default_factory=dict)
    runs: dict[int, RunObs] = field(default_factory=dict)


@dataclass(frozen=True)
class FenceRegression:
    child: ChildKey
    seen: int
    then: int
    at: float


_CHILDREN = text(
    "SELECT c.run_id, c.index, c.state, c.fence, c.attempt, c.max_attempts, c.owner,"
    " coalesce((c.checkpoint->>'done')::int, 0) AS done"
    " FROM dtask_children c JOIN dtask_runs r ON r.id = c.run_id"
    " WHERE c.run_id >= :first AND (r.state NOT IN ('succeeded', 'failed')"
    "   OR c.updated_at > now() - interval '30 seconds')"
)
_RUNS = text(
    "SELECT id, state, template, schedule, slot, error, created_at FROM dtask_runs"
    " WHERE id >= :first"
)


class Monitor(threading.Thread):
    def __init__(self, cluster: Cluster, first_run: int, every: float = 0.25) -> None:
        super().__init__(name="soak monitor", daemon=True)
        self.cluster = cluster
        self.first_run = first_run
        self.every = every
        self.snapshot = Snapshot()
        self.max_fence: dict[ChildKey, int] = {}
        self.regressions: list[FenceRegression] = []
        self.polls = 0
        self.failed_polls = 0
        self.rss: dict[str, list[tuple[float, int]]] = {}  # worker name -> (t, main+pool RSS)
        self._watchers: list[Callable[[Snapshot], bool]] = []
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._stop_event = threading.Event()
        self._last_rss = 0.0

    def watch(self, recovered: Callable[[Snapshot], bool]) -> None:
        """Call ``recovered`` with each new snapshot until it returns True."""
        with self._lock:
            self._watchers.append(recovered)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)

    def fresh(self) -> Snapshot:
        """A snapshot taken now (a fault's baseline), or the last one if PostgreSQL is down."""
        try:
            return self._poll()
        except Exception:
            return self.snapshot

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            try:
                snap = self._poll()
            except Exception:  # PostgreSQL restarting: the next poll tries again
                self.failed_polls += 1
                continue
            self.polls += 1
            self.snapshot = snap
            with self._lock:
                self._watchers = [w for w in self._watchers if not w(snap)]
            if snap.at - self._last_rss >= 2:
                self._last_rss = snap.at
                self._sample_rss(snap.at)

    def _poll(self) -> Snapshot:
        params: dict[str, Any] = {"first": self.first_run}
        with self._poll_lock, services.store().engine.connect() as conn:
            at = time.monotonic()
            child_rows = conn.execute(_CHILDREN, params).all()
            run_rows = conn.execute(_RUNS, params).all()
            return self._record(at, child_rows, run_rows)

    def _record(self, at: float, child_rows: Any, run_rows: Any) -> Snapshot:
        snap = Snapshot(at=at)
        for r in child_rows:
            key = (int(r.run_id), int(r.index))
            obs = ChildObs(r.state, int(r.fence), r.attempt, r.max_attempts, r.owner, int(r.done))
            snap.children[key] = obs
            seen = self.max_fence.get(key, 0)
            if obs.fence < seen:
                self.regressions.append(FenceRegression(key, seen, obs.fence, snap.at))
            self.max_fence[key] = max(seen, obs.fence)
        for r in run_rows:
            snap.runs[int(r.id)] = RunObs(
                r.state, r.template, r.schedule, r.slot, r.error, r.created_at
            )
        return snap

    def _sample_rss(self, at: float) -> None:
        for proc in self.cluster.live("worker"):
            try:
                main = psutil.Process(proc.pid)
                total = main.memory_info().rss
                for pool in main.children():
                    total += pool.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            self.rss.setdefault(proc.name, []).append((at, total))
