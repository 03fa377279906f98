"""Storage: SQLAlchemy models, engines, migrations and the store (the only SQL in dtask)."""

from dtask.db.child_reads import ChildView
from dtask.db.children import Claim, Finished, Refusal
from dtask.db.database import Database
from dtask.db.engine import Limits, engine_for
from dtask.db.recovery import Waiting
from dtask.db.redispatch import Redispatch
from dtask.db.runs import RunRecord
from dtask.db.store import Store
from dtask.db.workers import WorkerInfo

__all__ = [
    "ChildView",
    "Claim",
    "Database",
    "Finished",
    "Limits",
    "Redispatch",
    "Refusal",
    "RunRecord",
    "Store",
    "Waiting",
    "WorkerInfo",
    "engine_for",
]
