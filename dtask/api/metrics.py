"""``GET /metrics`` in Prometheus' text format (admin tokens), built at scrape time from
PostgreSQL by a collector of prometheus-client; ``GET /api/v1/alerts`` (what the token sees)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api.auth import Admin, Caller
from dtask.db import counters
from dtask.db.metrics import Snapshot
from dtask.domain.runs import ChildState, RunState

router = APIRouter(tags=["cluster"])
alerts = APIRouter(tags=["cluster"])


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.s = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.s
        runs = GaugeMetricFamily("dtask_runs", "Runs by state", labels=["state"])
        for run_state in RunState:
            runs.add_metric([run_state.value], s.runs.get(run_state.value, 0))
        yield runs
        children = GaugeMetricFamily("dtask_children", "Children by state", labels=["state"])
        for child_state in ChildState:
            children.add_metric([child_state.value], s.children.get(child_state.value, 0))
        yield children
        yield CounterMetricFamily(
            "dtask_child_starts", "Child starts (retries and failovers included)", s.attempts
        )
        yield self._counter(counters.REDISPATCHED, "Children re-sent after a lost message or lease")
        yield self._counter(counters.LEASE_EXPIRIES, "Leases that expired (owner dead or hung)")
        yield self._counter(
            counters.RATE_LIMITED, "Submits refused by a rate limit", label="client"
        )
        yield self._counter(counters.SLOTS_FIRED, "Schedule slots fired", label="schedule")
        yield self._counter(counters.SLOTS_MISSED, "Schedule slots missed", label="schedule")
        yield self._failover()
        lag = GaugeMetricFamily(
            "dtask_dispatch_lag_seconds",
            "Age of the oldest child still waiting in PostgreSQL, per queue and client",
            labels=["queue", "client"],
        )
        for queue, client, seconds in s.lag:
            lag.add_metric([queue, client], seconds)
        yield lag
        slots = GaugeMetricFamily(
            "dtask_worker_slots", "Live workers' child slots", labels=["worker", "state"]
        )
        for name, total, busy in s.workers:
            slots.add_metric([name, "busy"], busy)
            slots.add_metric([name, "idle"], max(total - busy, 0))
        yield slots
        yield GaugeMetricFamily("dtask_workers_live", "Workers reporting", len(s.workers))
        open_alerts = GaugeMetricFamily("dtask_alerts_open", "Open alerts", labels=["kind"])
        for kind, n in sorted(s.alerts.items()):
            open_alerts.add_metric([kind], n)
        yield open_alerts

    def _counter(self, name: str, documentation: str, label: str | None = None) -> Metric:
        values = self.s.counters.get(name, {})
        if label is None:
            return CounterMetricFamily(f"dtask_{name}", documentation, sum(values.values()))
        family = CounterMetricFamily(f"dtask_{name}", documentation, labels=[label])
        for value_label, value in sorted(values.items()):
            family.add_metric([value_label], value)
        return family

    def _failover(self) -> Metric:
        values = self.s.counters.get(counters.FAILOVER, {})
        buckets = [(f"{b:g}", values.get(f"le={b:g}", 0.0)) for b in counters.FAILOVER_BUCKETS]
        buckets.append(("+Inf", values.get("count", 0.0)))
        return HistogramMetricFamily(
            "dtask_failover_seconds",
            "From a dead owner's last lease renewal to its child's re-send",
            buckets=buckets,
            sum_value=values.get("sum", 0.0),
        )


def _exposition() -> bytes:
    settings = services.current().settings
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(services.store().metrics.snapshot(settings.worker_seen_within))
    )
    return generate_latest(registry)


@router.get("/metrics", response_class=Response)
async def metrics(token: Admin) -> Response:
    """Prometheus metrics for the whole cluster (admin tokens)."""
    return Response(await run_in_threadpool(_exposition), media_type=CONTENT_TYPE_LATEST)


@alerts.get("/alerts")
async def list_alerts(token: Caller) -> list[dict[str, Any]]:
    """Open alerts, oldest first: all of them for an admin token; for a client's token those
    about its own runs and the cluster's (workers), never another client's run nor a
    schedule (docs/monitoring.md)."""
    found = await run_in_threadpool(
        services.store().alerts.open, None if token.admin else token.client
    )
    return [a.as_json() for a in found]
