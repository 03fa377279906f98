"""This worker's row in `dtask_workers`: a report that comes after the shutdown's removal (the
reaper's thread finishing a pass) must not bring a stopped worker back to life."""

from __future__ import annotations

from typing import Any

from dtask import services
from dtask.worker import registry


class Consumer:
    """What ``registry.describe`` reads of Celery's consumer."""

    hostname = "registry-test@here"

    class task_consumer:
        queues: list[Any] = []

    class controller:
        concurrency = 3
        autoscaler = None


def names() -> set[str]:
    return {w.name for w in services.store().workers.live(60)}


def test_a_report_after_leaving_does_not_list_the_worker_again(dtask_env: dict[str, str]) -> None:
    registry._ready(sender=Consumer())
    assert Consumer.hostname in names()
    registry._leave()
    registry.report()  # the reaper's last pass, a moment too late
    assert Consumer.hostname not in names()
