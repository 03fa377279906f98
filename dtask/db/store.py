"""The store: every SQL statement dtask runs, one part per aggregate. PostgreSQL is the truth.

Each state change is a conditional UPDATE (``WHERE state = … [AND fence = …]``), so a duplicated
or late broker message can never move a run or child the wrong way.
"""

from __future__ import annotations

from dtask.db.alerts import AlertStore
from dtask.db.child_logs import ChildLogs
from dtask.db.children import ChildStore
from dtask.db.clients import ClientStore
from dtask.db.counters import CounterStore
from dtask.db.database import Database
from dtask.db.dispatch import DispatchStore
from dtask.db.inline import InlineStore
from dtask.db.leases import LeaseStore
from dtask.db.metrics import MetricsStore
from dtask.db.notify import NotifyStore
from dtask.db.recovery import RecoveryStore
from dtask.db.retention import RetentionStore
from dtask.db.runs import RunStore
from dtask.db.schedules import ScheduleStore
from dtask.db.steals import StealStore
from dtask.db.tokens import TokenStore
from dtask.db.waiting import WaitingReads
from dtask.db.workers import WorkerStore


class Store:
    """``store.runs``, ``store.children``, ``store.recovery`` and the other stores, one per
    aggregate, share one database (its engines); see ``Database`` for the child owners'
    engines."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.engine = db.engine
        self.runs = RunStore(self.db)
        self.children = ChildStore(self.db)
        self.inline = InlineStore(self.db)
        self.recovery = RecoveryStore(self.db)
        self.schedules = ScheduleStore(self.db)
        self.clients = ClientStore(self.db)
        self.workers = WorkerStore(self.db)
        self.dispatch = DispatchStore(self.db)
        self.tokens = TokenStore(self.db)
        self.notify = NotifyStore(self.db)
        self.alerts = AlertStore(self.db)
        self.counters = CounterStore(self.db)
        self.metrics = MetricsStore(self.db)
        self.leases = LeaseStore(self.db)
        self.retention = RetentionStore(self.db)
        self.steals = StealStore(self.db)
        self.waiting = WaitingReads(self.db)
        self.logs = ChildLogs(self.db)
