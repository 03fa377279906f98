"""The faults the soak injects. Each is a small object with a ``kind``, a ``weight`` and
``inject(ctx) -> Injection | None`` (None: nothing to aim at right now).

The list is pluggable: ``Soak(..., faults=[*DEFAULT_FAULTS, MyFault()])``. A fault whose
``needs_partitions`` is true is left out, with a printed reason, where network namespaces
cannot be made.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import redis

from dtask.services import embedded
from soak.cluster import Cluster, Proc
from soak.monitor import ChildKey, Monitor, Snapshot

FINAL = ("succeeded", "failed")


@dataclass
class Injection:
    """One fault, when it happened and what it hit. ``affected``: children running on what it
    hit, with their committed progress (checkpoint ``done``) at that moment."""

    kind: str
    at: float  # monotonic
    wall: float  # time.time(), to compare with PostgreSQL timestamps
    detail: str
    affected: dict[ChildKey, tuple[int, int]] = field(default_factory=dict)  # (fence, done)
    recovered_at: float | None = None
    heal: Callable[[], None] | None = None
    heal_after: float = 0.0
    finished_before: frozenset[int] = frozenset()  # runs already final at the fault

    @property
    def recovery(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.at


@dataclass
class FaultContext:
    cluster: Cluster
    monitor: Monitor
    rng: random.Random
    submit_broken: Callable[[], int | None]
    schedule_outages: list[tuple[float, float]]  # wall-time spans when no beat could fire
    schedule: str = ""


class Fault(Protocol):
    kind: str
    weight: float
    needs_partitions: bool

    def inject(self, ctx: FaultContext) -> Injection | None: ...


def _running_on(
    snap: Snapshot, pids: set[int] | None, queued: bool = False
) -> dict[ChildKey, tuple[int, int]]:
    """Children running on ``pids`` (all running children if None), with ``queued`` also
    the pending children of running runs (their messages sit in the broker): (fence, done)."""
    return {
        key: (c.fence, c.done)
        for key, c in snap.children.items()
        if (c.state == "running" and (pids is None or c.owner_pid in pids))
        or (queued and c.state == "pending" and _run_state(snap, key[0]) == "running")
    }


def _run_state(snap: Snapshot, run_id: int) -> str | None:
    run = snap.runs.get(run_id)
    return None if run is None else run.state


def _progressed(inj: Injection, snap: Snapshot, new_owner: bool = False) -> bool:
    """Recovered: every child running on what the fault hit committed progress past its
    checkpoint at the fault (with ``new_owner``: under a newer fence, as a killed owner cannot
    write) or finished, or its run was cancelled; with no child hit, the next run to finish."""
    if inj.affected:
        for key, (fence, done) in inj.affected.items():
            c = snap.children.get(key)
            if c is None or c.state in FINAL:
                continue
            moved = c.done > done and (c.fence > fence or not new_owner)
            run = snap.runs.get(key[0])
            if not moved and (run is None or run.state != "cancelled"):
                return False
        return True
    return any(r.state in FINAL and i not in inj.finished_before for i, r in snap.runs.items())


def _track(ctx: FaultContext, inj: Injection, done: Callable[[Injection, Snapshot], bool]) -> None:
    snap = ctx.monitor.snapshot
    inj.finished_before = frozenset(i for i, r in snap.runs.items() if r.state in FINAL)

    def check(snap: Snapshot) -> bool:
        if snap.at > inj.at and done(inj, snap):
            inj.recovered_at = snap.at
            return True
        return False

    ctx.monitor.watch(check)


def _worker_fault(ctx: FaultContext, kind: str, victim: Proc, detail: str) -> Injection:
    pids = {victim.pid, *victim.pool_pids()}
    affected = _running_on(ctx.monitor.fresh(), pids)
    return Injection(kind, time.monotonic(), time.time(), f"{victim.name}: {detail}", affected)


class WorkerKill:
    """SIGKILL a whole worker (main and pool); a fresh worker replaces it at once."""

    kind, weight, needs_partitions = "worker SIGKILL", 3.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        witness = ctx.cluster.witness()
        victims = [p for p in ctx.cluster.live("worker") if p is not witness]
        if not victims:
            return None
        victim = ctx.rng.choice(victims)
        inj = _worker_fault(ctx, self.kind, victim, "SIGKILL, replaced")
        ctx.cluster.kill(victim)
        ctx.cluster.spawn("worker")
        _track(ctx, inj, partial(_progressed, new_owner=True))
        return inj


class WorkerStop:
    """SIGSTOP a whole worker for 1 to 2 leases (some pauses outlive the lease), then SIGCONT."""

    kind, weight, needs_partitions = "worker SIGSTOP/SIGCONT", 2.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        victim = ctx.rng.choice(ctx.cluster.live("worker"))
        pause = ctx.rng.uniform(1.0, 2 * float(ctx.cluster.env.get("DTASK_LEASE_TTL", "8")))
        inj = _worker_fault(ctx, self.kind, victim, f"stopped {pause:.1f} s")
        victim.signal(signal.SIGSTOP)
        inj.heal, inj.heal_after = (lambda: victim.signal(signal.SIGCONT)), pause
        _track(ctx, inj, _progressed)
        return inj


class PoolKill:
    """SIGKILL one pool process, one running a child when there is one."""

    kind, weight, needs_partitions = "pool process SIGKILL", 2.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        snap = ctx.monitor.fresh()
        busy = [(k, c.owner_pid) for k, c in snap.children.items() if c.state == "running"]
        ctx.rng.shuffle(busy)
        for key, pid in busy:
            if pid is not None and ctx.cluster.owner_of(pid) is not None:
                inj = Injection(  # with the rest of the message it holds, if any
                    self.kind, time.monotonic(), time.time(), f"pid {pid} running {key}",
                    _running_on(snap, {pid}),
                )  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _track(ctx, inj, partial(_progressed, new_owner=True))
                return inj
        return None


def _beat_ok_to_hit(ctx: FaultContext) -> list[Proc]:
    """One beat at a time: the others keep every slot within its grace."""
    beats = ctx.cluster.live("beat")
    return beats if len(beats) == ctx.cluster.sizes[1] else []


def _next_slot_fired(inj: Injection, snap: Snapshot) -> bool:
    """Recovered: a schedule slot was triggered after the fault."""
    return any(r.schedule and r.created_at.timestamp() > inj.wall for r in snap.runs.values())


class BeatKill:
    kind, weight, needs_partitions = "beat SIGKILL", 1.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        beats = _beat_ok_to_hit(ctx)
        if not beats:
            return None
        victim = ctx.rng.choice(beats)
        inj = Injection(self.kind, time.monotonic(), time.time(), f"{victim.name}, replaced")
        ctx.cluster.kill(victim)
        ctx.cluster.spawn("beat")
        _track(ctx, inj, _next_slot_fired)
        return inj


class BeatStop:
    kind, weight, needs_partitions = "beat SIGSTOP/SIGCONT", 1.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        beats = _beat_ok_to_hit(ctx)
        if not beats:
            return None
        victim = ctx.rng.choice(beats)
        pause = ctx.rng.uniform(2.0, 8.0)
        inj = Injection(self.kind, time.monotonic(), time.time(), f"{victim.name} {pause:.1f} s")
        victim.signal(signal.SIGSTOP)
        inj.heal, inj.heal_after = (lambda: victim.signal(signal.SIGCONT)), pause
        _track(ctx, inj, _next_slot_fired)
        return inj


class RedisRestart:
    """Restart the embedded Redis (broker and result backend): with its data gone, or saved
    at shutdown and loaded again (what a Redis with persistence does). Hit: the running
    children and the queued (pending) children of running runs, whose messages it held."""

    weight, needs_partitions = 1.0, False

    def __init__(self, keep_data: bool) -> None:
        self.keep_data = keep_data
        self.kind = "Redis restart, data kept" if keep_data else "Redis restart, data lost"

    def inject(self, ctx: FaultContext) -> Injection | None:
        home = ctx.cluster.home
        inj = Injection(
            self.kind, time.monotonic(), time.time(), "",
            _running_on(ctx.monitor.fresh(), None, queued=True),
        )  # fmt: skip
        dump = home / "redis" / "dump.rdb"
        if self.keep_data:
            client = redis.Redis(unix_socket_path=str(embedded.redis_socket(home)))
            with contextlib.suppress(redis.RedisError):
                client.shutdown(save=True)
            client.close()
            deadline = time.monotonic() + 10
            while embedded.redis_socket(home).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            embedded.ensure_redis(home)
        else:
            dump.unlink(missing_ok=True)
            embedded.restart_redis(home)
        inj.detail = f"back after {time.monotonic() - inj.at:.1f} s"
        _track(ctx, inj, _progressed)
        return inj


class PostgresRestart:
    weight, needs_partitions = 1.0, False

    def __init__(self, crash: bool) -> None:
        self.crash = crash
        self.kind = "PostgreSQL -m immediate" if crash else "PostgreSQL restart (fast)"

    def inject(self, ctx: FaultContext) -> Injection | None:
        snap = ctx.monitor.fresh()
        inj = Injection(self.kind, time.monotonic(), time.time(), "", _running_on(snap, None))
        embedded.restart_postgres(ctx.cluster.home, crash=self.crash)
        inj.detail = f"back after {time.monotonic() - inj.at:.1f} s"
        ctx.schedule_outages.append((inj.wall, time.time()))
        _track(ctx, inj, _progressed)
        return inj


class LinkCut:
    """Cut a worker's link to PostgreSQL, to the broker, or to both (packets dropped silently,
    no RST) for half a lease to two leases, then heal it. Short cuts must go unnoticed; long
    ones must move the worker's children elsewhere, and the worker must rejoin after the heal."""

    weight, needs_partitions = 1.0, True
    LINKS = {"postgres": ("db",), "broker": ("mq",), "both": ("db", "mq")}

    def __init__(self, to: str) -> None:
        self.links = self.LINKS[to]
        self.kind = f"link cut: {to}"

    def inject(self, ctx: FaultContext) -> Injection | None:
        victims = [p for p in ctx.cluster.wired() if p.started < time.monotonic() - 5]
        if not victims:
            return None
        victim = ctx.rng.choice(victims)
        net = victim.net
        assert net is not None
        lease = float(ctx.cluster.env.get("DTASK_LEASE_TTL", "8"))
        cut = ctx.rng.uniform(0.5 * lease, 2 * lease)
        inj = _worker_fault(ctx, self.kind, victim, f"cut {cut:.1f} s")
        net.partition.cut(*self.links)

        def heal() -> None:
            if victim.net is not None:  # not killed meanwhile
                victim.net.partition.heal(*self.links)

        inj.heal, inj.heal_after = heal, cut
        _track(ctx, inj, _progressed)
        return inj


class BrokenSplit:
    """A user template whose split raises: that run must fail, and nothing else notice."""

    kind, weight, needs_partitions = "split raises (user code)", 1.0, False

    def inject(self, ctx: FaultContext) -> Injection | None:
        run_id = ctx.submit_broken()
        if run_id is None:
            return None
        inj = Injection(self.kind, time.monotonic(), time.time(), f"run {run_id}")

        def failed(inj: Injection, snap: Snapshot) -> bool:
            run = snap.runs.get(run_id)
            return run is not None and run.state == "failed"

        _track(ctx, inj, failed)
        return inj


DEFAULT_FAULTS: list[Fault] = [
    WorkerKill(),
    WorkerStop(),
    PoolKill(),
    BeatKill(),
    BeatStop(),
    RedisRestart(keep_data=False),
    RedisRestart(keep_data=True),
    PostgresRestart(crash=False),
    PostgresRestart(crash=True),
    BrokenSplit(),
    LinkCut(to="postgres"),
    LinkCut(to="broker"),
    LinkCut(to="both"),
]
