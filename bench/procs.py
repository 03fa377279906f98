"""CPU time and peak RSS of the cluster's processes, grouped by role."""

from __future__ import annotations

import collections
import os
import threading

import psutil


def role(proc: psutil.Process, workers: dict[int, str]) -> str | None:
    """'dtask main', 'dtask pool', 'raw main', 'raw pool', 'redis', 'postgres', 'bench'."""
    try:
        name = proc.name()
        if proc.pid == os.getpid():
            return "bench"
        if "redis-server" in name:
            return "redis"
        if name.startswith("postgres"):
            return "postgres"
        if proc.pid in workers:
            return f"{workers[proc.pid]} main"
        parent = proc.ppid()
        if parent in workers:
            return f"{workers[parent]} pool"
        if "bench.raw_client" in " ".join(proc.cmdline()):
            return "raw client"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return None


def snapshot(workers: dict[int, str]) -> dict[int, tuple[str, float]]:
    """pid -> (role, user+system CPU seconds) for every process that has a role."""
    out = {}
    for proc in psutil.process_iter():
        r = role(proc, workers)
        if r is None:
            continue
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = (r, t.user + t.system + t.children_user + t.children_system)
    return out


def cpu_by_role(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    totals: collections.Counter[str] = collections.Counter()
    for pid, (r, cpu) in after.items():
        totals[r] += cpu - before.get(pid, (r, 0.0))[1]
    return dict(totals)


class PeakRss(threading.Thread):
    """Samples the RSS of every process with a role until stopped; keeps the peak per pid."""

    def __init__(self, workers: dict[int, str], every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.workers = workers
        self.every = every
        self.peak: dict[int, tuple[str, int]] = {}
        self._roles: dict[int, str | None] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            for proc in psutil.process_iter():
                if proc.pid not in self._roles:  # a role lookup reads /proc: once per pid
                    self._roles[proc.pid] = role(proc, self.workers)
                r = self._roles[proc.pid]
                if r is None:
                    continue
                try:
                    rss = proc.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
                if rss > self.peak.get(proc.pid, (r, 0))[1]:
                    self.peak[proc.pid] = (r, rss)

    def stop(self) -> dict[int, tuple[str, int]]:
        self._stop_event.set()
        self.join()
        return self.peak
