"""dtask: long jobs split into resumable child tasks, run by Celery, tracked in PostgreSQL."""

from dtask.client import Run, get_run, submit
from dtask.context import ChildContext
from dtask.exceptions import (
    BrokerUnavailable,
    ChildFailed,
    ConfigurationError,
    DatabaseUnavailable,
    DtaskError,
    InvalidSplit,
    InvalidVariables,
    KeyConflict,
    LeaseLost,
    RunNotFound,
    ServiceUnavailable,
    TemplateDefinitionError,
    TooManyChildren,
    UnknownTemplate,
    WaitTimeout,
)
from dtask.runs import ChildCounts, ChildState, RunState, RunStatus
from dtask.splitting import RangeSplit, SplitStrategy
from dtask.templates import Param, Template, registry, template

__all__ = [
    "BrokerUnavailable",
    "ChildContext",
    "ChildCounts",
    "ChildFailed",
    "ChildState",
    "ConfigurationError",
    "DatabaseUnavailable",
    "DtaskError",
    "InvalidSplit",
    "InvalidVariables",
    "KeyConflict",
    "LeaseLost",
    "Param",
    "RangeSplit",
    "Run",
    "RunNotFound",
    "RunState",
    "RunStatus",
    "ServiceUnavailable",
    "SplitStrategy",
    "Template",
    "TemplateDefinitionError",
    "TooManyChildren",
    "UnknownTemplate",
    "WaitTimeout",
    "get_run",
    "registry",
    "submit",
    "template",
]
