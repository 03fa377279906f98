"""The live workers, as they report themselves in PostgreSQL."""

from __future__ import annotations

from dtask import services
from dtask.db.workers import WorkerInfo


def live_workers() -> list[WorkerInfo]:
    settings = services.current().settings
    return services.store().workers.live(settings.worker_seen_within)


def slots_for(queue: str) -> int:
    """Child slots of the live workers that consume ``queue``."""
    return sum(w.slots for w in live_workers() if queue in w.queues)
