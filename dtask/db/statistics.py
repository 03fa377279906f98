"""Fresh planner statistics after a large split.

A run's children arrive by the thousand in one COPY, and its claims, releases and counts are
planned from the statistics of whatever dtask_children held at autovacuum's last ANALYZE
(once a minute at best; never, on a fresh database, before a short run ends). Planned with
none, or with those of a table that held a hundred rows, a 100,000-child run's claims read
every pending child of the run (27 ms each) and its releases every unsent child of the
table; planned for the run as it was split, each probes only what it asks for. So a large split
asks for an ANALYZE when its children are a good share of the table (at the default
statistics target PostgreSQL samples at most 30,000 of its rows). The master asks once
the run's first message has left: its statements are planned well enough from a table's
older statistics, and the ANALYZE (50-110 ms at 10,000 children) is then off the path of its
first child."""

from __future__ import annotations

import logging

from sqlalchemy.exc import SQLAlchemyError

from dtask.db.database import Database, sql
from dtask.exceptions import DtaskError

log = logging.getLogger(__name__)

LARGE_SPLIT = 5_000  # children: below this, stale plans cost little
SHARE = 0.1  # of the rows the statistics counted: above it, they no longer describe the table


def after_split(db: Database, children: int) -> None:
    """ANALYZE dtask_children if ``children`` just inserted outdate its statistics. Never
    waits on autovacuum (which holds the table's ANALYZE lock while it works) and never
    fails the split: a plan made from older statistics is still correct, only slower."""
    if children < LARGE_SPLIT:
        return
    try:
        with db.tx() as conn:
            counted = conn.execute(
                sql("SELECT reltuples FROM pg_class WHERE oid = 'dtask_children'::regclass")
            ).scalar()
            if counted is not None and 0 <= children < SHARE * float(counted):
                return
            conn.execute(sql("SET LOCAL lock_timeout = '100ms'"))
            conn.execute(sql("ANALYZE dtask_children"))
    except (DtaskError, SQLAlchemyError) as exc:
        log.info("statistics of dtask_children not refreshed after a split: %s", exc)
