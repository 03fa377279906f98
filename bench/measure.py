"""One measurement each: a dtask run or a raw Celery chord end to end, statement and command
counts, submit latency, failover and drain. bench/run.py strings them together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, text

from bench import procs
from bench.cluster import REPO, Workers


@dataclass
class FanOut:
    system: str  # "dtask" | "raw"
    n: int
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.n / self.seconds


def wait_run(engine: Engine, run_id: int, timeout: float, poll: float = 0.02) -> Any:
    """Poll the run's own row (cheap, unlike counting its children) until it has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            row = conn.execute(
                text("SELECT state, started_at, finished_at FROM dtask_runs WHERE id = :id"),
                {"id": run_id},
            ).one()
        if row.state in ("succeeded", "failed", "cancelled"):
            return row
        time.sleep(poll)
    raise TimeoutError(f"run {run_id} not finished after {timeout} s")


ROW_TABLES = ("dtask_children", "dtask_runs")


def row_writes(engine: Engine) -> dict[str, int]:
    """Rows inserted, updated and deleted so far in the tables a run's children write, as
    PostgreSQL counts them (pg_stat_user_tables), once its backends' counters have settled:
    PostgreSQL 15 publishes an idle backend's 10 s after its last (PGSTAT_IDLE_INTERVAL)."""

    def read() -> dict[str, int]:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del AS w"
                    " FROM pg_stat_user_tables WHERE relname = ANY(:names)"
                ),
                {"names": list(ROW_TABLES)},
            ).all()
        return {r.relname: int(r.w) for r in rows}

    seen = read()
    for _ in range(6):
        time.sleep(11)
        again = read()
        if again == seen:
            break
        seen = again
    return seen


def writes_per_child(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    return {t: (after.get(t, 0) - before.get(t, 0)) / n for t in ROW_TABLES}


def dtask_fanout(engine: Engine, n: int, roles: dict[int, str], rss: bool = False) -> FanOut:
    import dtask

    sampler = procs.PeakRss(roles) if rss else None
    if sampler:
        sampler.start()
    before = procs.snapshot(roles)
    start = time.time()
    run = dtask.submit("bench_noop", {"n": n})
    # The time comes from the run's finished_at, so polling slowly costs no precision and
    # leaves the CPU to the cluster.
    row = wait_run(engine, run.id, timeout=3600, poll=0.2)
    seconds = row.finished_at.timestamp() - start
    assert row.state == "succeeded", row
    result = FanOut("dtask", n, seconds, procs.cpu_by_role(before, procs.snapshot(roles)))
    if sampler:
        result.rss_mb = _peaks(sampler.stop())
    return result


def raw_fanout(n: int, roles: dict[int, str], rss: bool = False) -> FanOut:
    sampler = procs.PeakRss(roles) if rss else None
    if sampler:
        sampler.start()
    before = procs.snapshot(roles)
    out = subprocess.run(
        [sys.executable, "-m", "bench.raw_client", str(n)],
        capture_output=True, text=True, cwd=REPO, check=True, timeout=3600,
    )  # fmt: skip
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    result = FanOut("raw", n, measured["seconds"], procs.cpu_by_role(before, procs.snapshot(roles)))
    if sampler:
        result.rss_mb = _peaks(sampler.stop())
        result.rss_mb["raw client"] = measured["rss_mb"]
    return result


def _peaks(peak: dict[int, tuple[str, int]]) -> dict[str, float]:
    """Largest RSS per role (MB)."""
    out: dict[str, float] = {}
    for role, rss in peak.values():
        out[role] = max(out.get(role, 0.0), rss / 2**20)
    return out


# --- cost per child -------------------------------------------------------------------------


def redis_client() -> redis.Redis:
    from dtask import services
    from dtask.services import embedded

    return redis.Redis(
        unix_socket_path=str(embedded.redis_socket(services.current().settings.home))
    )


def redis_counters(client: redis.Redis) -> tuple[int, int]:
    """(commands processed, bytes in + out) since the last CONFIG RESETSTAT."""
    stats = client.info("stats")
    calls = sum(int(v["calls"]) for v in client.info("commandstats").values())
    return calls, int(stats["total_net_input_bytes"]) + int(stats["total_net_output_bytes"])


def statement_log(engine: Engine, on: bool) -> None:
    """log_statement=all with the application name in each line (pg_stat_statements is not
    in pgserver's build: pg_available_extensions has no pg_stat_statements)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if on:
            conn.execute(text("ALTER SYSTEM SET log_statement = 'all'"))
            conn.execute(text("ALTER SYSTEM SET log_line_prefix = '%m [%p] app=%a '"))
        else:
            conn.execute(text("ALTER SYSTEM RESET log_statement"))
            conn.execute(text("ALTER SYSTEM RESET log_line_prefix"))
        conn.execute(text("SELECT pg_reload_conf()"))
    time.sleep(0.5)


_STATEMENT = re.compile(r"app=dtask:(\d+) LOG:  (statement|execute [^:]*): (.*)")


def count_statements(log: Path, offset: int, exclude_pid: int) -> dict[str, int]:
    """Statements logged after ``offset``, by their first words, except the bench's own."""
    counts: dict[str, int] = {}
    with log.open(errors="replace") as f:
        f.seek(offset)
        for line in f:
            match = _STATEMENT.search(line)
            if match is None or int(match[1]) == exclude_pid:
                continue
            counts[_kind(match[3])] = counts.get(_kind(match[3]), 0) + 1
    return counts


def _kind(sql: str) -> str:
    words = sql.split()
    head = " ".join(words[:3]) if words[:1] == ["UPDATE"] else " ".join(words[:2])
    return head[:40]


# --- latency --------------------------------------------------------------------------------


def latency(engine: Engine, samples: int) -> list[tuple[float, float]]:
    """(submit -> master running, submit -> first child running) in seconds, one run at a time."""
    import dtask

    out = []
    for _ in range(samples):
        start = time.time()
        run = dtask.submit("bench_noop", {"n": 1})
        row = wait_run(engine, run.id, timeout=60, poll=0.005)
        with engine.connect() as conn:
            child = conn.execute(
                text("SELECT min(started_at) FROM dtask_children WHERE run_id = :id"),
                {"id": run.id},
            ).scalar_one()
        out.append((row.started_at.timestamp() - start, child.timestamp() - start))
    return out


# --- failover and drain ---------------------------------------------------------------------


def _child_row(engine: Engine, run_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT owner, state, attempt, checkpoint FROM dtask_children"
                " WHERE run_id = :r AND index = 0"
            ),
            {"r": run_id},
        ).first()


def _running_with_progress(engine: Engine, run_id: int) -> Any:
    while True:
        row = _child_row(engine, run_id)
        if (
            row is not None
            and row.state == "running"
            and isinstance(row.checkpoint, dict)
            and row.checkpoint.get("done", 0) > 50
        ):
            return row
        time.sleep(0.01)


def _owner_pid(owner: str) -> int:
    return int(owner.rsplit(":", 1)[1])


def _worker_of(workers: Workers, pid: int) -> subprocess.Popen[bytes]:
    group = os.getpgid(pid)
    return next(p for p in workers.procs if p.pid == group)


def failover_and_drain(
    engine: Engine, workers: Workers, kills: int, drains: int
) -> dict[str, list[float]]:
    """SIGKILL the whole worker running a child: time until it runs again elsewhere.
    SIGTERM the worker running a child: time until that worker has exited, and until the
    child runs elsewhere. Three one-process workers; a killed or drained one is replaced."""
    import dtask

    workers.ready(*[workers.dtask(1) for _ in range(3)])
    out: dict[str, list[float]] = {"kill_resumed": [], "term_exited": [], "term_resumed": []}
    for round_ in range(kills + drains):
        kill = round_ < kills
        run = dtask.submit("bench_slow", {"items": 300, "delay": 0.01})
        row = _running_with_progress(engine, run.id)
        victim = _worker_of(workers, _owner_pid(row.owner))
        os.killpg(victim.pid, signal.SIGKILL if kill else signal.SIGTERM)
        hit = time.monotonic()
        exited = None
        while True:
            if exited is None and victim.poll() is not None:
                exited = time.monotonic() - hit
            now = _child_row(engine, run.id)
            if now.state in ("running", "succeeded") and now.owner != row.owner:
                break
            time.sleep(0.01)
        resumed = time.monotonic() - hit
        victim.wait(60)
        if exited is None:
            exited = time.monotonic() - hit
        workers.forget(victim)
        if kill:
            out["kill_resumed"].append(resumed)
        else:
            out["term_exited"].append(exited)
            out["term_resumed"].append(resumed)
        print(f"  {'kill' if kill else 'drain'} {round_ + 1}: resumed after {resumed:.2f} s"
              + ("" if kill else f", worker exited after {exited:.2f} s"), flush=True)  # fmt: skip
        replacement = workers.dtask(1)
        assert wait_run(engine, run.id, timeout=120).state == "succeeded"
        workers.ready(replacement)
    return out
