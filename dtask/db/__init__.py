"""Storage: SQLAlchemy models, engines and the store (the only SQL in dtask)."""

from dtask.db.engine import engine_for
from dtask.db.store import Claim, Redispatch, Refusal, RunRecord, Store

__all__ = ["Claim", "Redispatch", "Refusal", "RunRecord", "Store", "engine_for"]
