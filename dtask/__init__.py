"""dtask: long jobs split into resumable child tasks, run by Celery, tracked in PostgreSQL.

The domain (templates, splitting, run states, schedules) is imported here as is; what needs
the services (``submit``, ``Run``, the schedule functions) is imported on first use, so
``import dtask`` (and any ``dtask.domain`` module) loads neither SQLAlchemy nor Celery.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Unpack

from dtask.domain.async_context import AsyncChildContext
from dtask.domain.bulk import Outcome, Submitted
from dtask.domain.clients import Client, Rate, Tier
from dtask.domain.context import ChildContext
from dtask.domain.dates import DateRangeSplit
from dtask.domain.deadlines import OnLate
from dtask.domain.params import Param
from dtask.domain.runs import ChildCounts, ChildState, RunState, RunStatus
from dtask.domain.schedules import Misfire, Overlap, Schedule, When
from dtask.domain.splitting import RangeSplit, SplitStrategy
from dtask.domain.templates import RunOptions, Template, registry, template, use_launcher
from dtask.exceptions import (
    BrokerUnavailable,
    Busy,
    ChildFailed,
    ChildNotFound,
    ClientNotFound,
    ConfigurationError,
    Conflict,
    DatabaseUnavailable,
    DtaskError,
    ExecutionCapExceeded,
    Invalid,
    InvalidClient,
    InvalidConcurrency,
    InvalidDelayTolerance,
    InvalidExecutionCap,
    InvalidResult,
    InvalidSchedule,
    InvalidSplit,
    InvalidStart,
    InvalidVariables,
    KeyConflict,
    LeaseLost,
    MissingExtra,
    NotFound,
    Permanent,
    RateLimited,
    RunCancelled,
    RunFailed,
    RunNotFound,
    ScheduleExists,
    ScheduleNotFound,
    SchemaMismatch,
    ServiceUnavailable,
    SplitFailed,
    TemplateDefinitionError,
    TooManyChildren,
    UnknownTemplate,
    UpstreamFailed,
    UpstreamNotFound,
    WaitTimeout,
)

if TYPE_CHECKING:
    from dtask.client.aio import asubmit
    from dtask.client.bulk import submit_many
    from dtask.client.clients import get_client, list_clients, remove_client, set_client
    from dtask.client.runs import Run, get_run, submit
    from dtask.client.schedules import (
        add_schedule,
        backfill_schedule,
        get_schedule,
        list_schedules,
        pause_schedule,
        remove_schedule,
        resume_schedule,
    )
    from dtask.worker.adopt import init_app

_LAZY = {
    "init_app": "dtask.worker.adopt",
    "asubmit": "dtask.client.aio",
    "get_client": "dtask.client.clients",
    "list_clients": "dtask.client.clients",
    "remove_client": "dtask.client.clients",
    "set_client": "dtask.client.clients",
    "Run": "dtask.client.runs",
    "get_run": "dtask.client.runs",
    "submit": "dtask.client.runs",
    "submit_many": "dtask.client.bulk",
    "add_schedule": "dtask.client.schedules",
    "backfill_schedule": "dtask.client.schedules",
    "get_schedule": "dtask.client.schedules",
    "list_schedules": "dtask.client.schedules",
    "pause_schedule": "dtask.client.schedules",
    "remove_schedule": "dtask.client.schedules",
    "resume_schedule": "dtask.client.schedules",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dtask' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


class _Client:
    """The port through which ``Template.delay``/``submit``/``schedule`` reach the client."""

    def submit(
        self,
        template: str,
        variables: dict[str, Any],
        *,
        key: str | None,
        **options: Unpack[RunOptions],
    ) -> Run:
        from dtask.client.runs import submit

        return submit(template, variables, key=key, **options)

    async def asubmit(
        self,
        template: str,
        variables: dict[str, Any],
        *,
        key: str | None,
        **options: Unpack[RunOptions],
    ) -> Run:
        from dtask.client.aio import asubmit

        return await asubmit(template, variables, key, **options)

    def submit_many(
        self,
        template: str,
        items: Iterable[Mapping[str, Any]],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[RunOptions],
    ) -> list[Submitted]:
        from dtask.client.bulk import submit_many

        return submit_many(template, items, keys=keys, **options)

    def schedule(
        self,
        name: str,
        template: str,
        variables: dict[str, Any],
        *,
        replace: bool,
        after_schedule: str | None = None,
        **when: Unpack[When],
    ) -> Schedule:
        from dtask.client.schedules import add_schedule

        return add_schedule(
            name, template, variables, replace=replace, after_schedule=after_schedule, **when
        )

    def signature(
        self, template: str, variables: dict[str, Any], *, key: str | None, immutable: bool
    ) -> Any:
        from dtask.worker.messages import submit_signature

        return submit_signature(template, variables, key, immutable)

    def on_commit(self, callback: Callable[[], Any]) -> None:
        from dtask.client.transactions import on_commit

        on_commit(callback)


use_launcher(_Client())

__all__ = [
    "AsyncChildContext",
    "BrokerUnavailable",
    "Busy",
    "ChildContext",
    "ChildCounts",
    "ChildFailed",
    "ChildNotFound",
    "ChildState",
    "Client",
    "ClientNotFound",
    "ConfigurationError",
    "Conflict",
    "DatabaseUnavailable",
    "DateRangeSplit",
    "DtaskError",
    "ExecutionCapExceeded",
    "Invalid",
    "InvalidClient",
    "InvalidConcurrency",
    "InvalidDelayTolerance",
    "InvalidExecutionCap",
    "InvalidResult",
    "InvalidSchedule",
    "InvalidSplit",
    "InvalidStart",
    "InvalidVariables",
    "KeyConflict",
    "LeaseLost",
    "Misfire",
    "MissingExtra",
    "NotFound",
    "OnLate",
    "Outcome",
    "Overlap",
    "Param",
    "Permanent",
    "RangeSplit",
    "Rate",
    "RateLimited",
    "Run",
    "RunCancelled",
    "RunFailed",
    "RunNotFound",
    "RunOptions",
    "RunState",
    "RunStatus",
    "Schedule",
    "ScheduleExists",
    "ScheduleNotFound",
    "SchemaMismatch",
    "ServiceUnavailable",
    "SplitFailed",
    "SplitStrategy",
    "Submitted",
    "Template",
    "TemplateDefinitionError",
    "Tier",
    "TooManyChildren",
    "UnknownTemplate",
    "UpstreamFailed",
    "UpstreamNotFound",
    "WaitTimeout",
    "add_schedule",
    "asubmit",
    "backfill_schedule",
    "get_client",
    "get_run",
    "get_schedule",
    "init_app",
    "list_clients",
    "list_schedules",
    "pause_schedule",
    "registry",
    "remove_client",
    "remove_schedule",
    "resume_schedule",
    "set_client",
    "submit",
    "submit_many",
    "template",
]
