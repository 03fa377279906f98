"""This worker's row in `dtask_workers`: a report that comes after the shutdown's removal (the
reaper's thread finishing a pass) must not bring a stopped worker back to life."""

from __future__ import annotations

from typing import Any

from dtask import services
from dtask.worker import presence


class Consumer:
    """What ``presence.describe`` reads of Celery's consumer."""

    hostname = "presence-test@here"

    class task_consumer:
        queues: list[Any] = []

    class controller:
        concurrency = 3
        autoscaler = None


def names() -> set[str]:
    return {w.name for w in services.store().workers.live(60)}


def test_a_report_after_leaving_does_not_list_the_worker_again(dtask_env: dict[str, str]) -> None:
    presence._ready(sender=Consumer())
    assert Consumer.hostname in names()
    presence._leave()
    presence.report()  # the reaper's last pass, a moment too late
    assert Consumer.hostname not in names()
