"""dtask's Celery tasks by name: their options and the module that implements each.

Light on purpose: ``dtask.init_app`` puts every task on a host app from this table, as a thin
entry that imports its implementation on the first call, so a process that only sends (a web
process, beat) never loads the worker's modules (SQLAlchemy, the lifecycle, the loops)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from celery import Celery

MASTER = "dtask.master"
MASTERS = "dtask.masters"  # the masters of several runs of one template (a bulk submit)
PICKUP = "dtask.pickup"  # the masters of the runs single submits left to a pickup
CHILD = "dtask.child"
CHILDREN = "dtask.children"  # several short children of one run in one message
FINALIZE = "dtask.finalize"
SUBMIT = "dtask.submit"
CHAINS = "dtask.chains"


class Entry(NamedTuple):
    module: str
    options: dict[str, Any]


# Acked late and rejected when their process dies: PostgreSQL, not the ack, decides.
_EVERY = {"acks_late": True, "reject_on_worker_lost": True, "serializer": "json"}
_TASKS = "dtask.worker.tasks"
ENTRIES: dict[str, Entry] = {
    MASTER: Entry(_TASKS, {"bind": True, "ignore_result": True, "max_retries": None}),
    MASTERS: Entry(_TASKS, {"bind": True, "ignore_result": True, "max_retries": None}),
    SUBMIT: Entry(_TASKS, {"bind": True, "ignore_result": False}),
    CHAINS: Entry(_TASKS, {"ignore_result": True}),
    # ignore_result on the task, not only on its messages: Celery before 5.6.3 reads it from the
    # task alone for a failure, and kept a failed child's result in Redis for result_expires
    CHILD: Entry(
        _TASKS,
        {"bind": True, "max_retries": None, "track_started": False, "ignore_result": True},
    ),
    FINALIZE: Entry(_TASKS, {"ignore_result": True}),
    PICKUP: Entry("dtask.worker.pickup", {"ignore_result": True}),
    CHILDREN: Entry(
        "dtask.worker.batch",
        {"bind": True, "max_retries": None, "track_started": False, "ignore_result": True},
    ),
}
_implemented: dict[str, Callable[..., Any]] = {}


def options(name: str) -> dict[str, Any]:
    """Everything Celery's ``task`` decorator takes for the task ``name``."""
    return {"name": name, **_EVERY, **ENTRIES[name].options}


def implements(name: str, function: Callable[..., Any]) -> None:
    """Called by the module ``ENTRIES`` names for ``name`` as it defines the task."""
    _implemented[name] = function


def implementation(name: str) -> Callable[..., Any]:
    if name not in _implemented:
        importlib.import_module(ENTRIES[name].module)
    return _implemented[name]


def register(host: Celery) -> None:
    """dtask's tasks on ``host`` (``dtask.init_app``), each importing its module when first run."""
    for name, entry in ENTRIES.items():
        host.task(shared=False, **options(name))(_entry(name, entry))


def _entry(name: str, entry: Entry) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return implementation(name)(*args, **kwargs)

    run.__name__ = run.__qualname__ = name.rpartition(".")[2]
    run.__module__ = entry.module
    return run
