"""What this process last learned of its link to PostgreSQL.

A pool process that found PostgreSQL out of reach (a child's lease ran out unrenewed, a claim
could not connect) hands the children it receives next back to the broker at once, for a
worker that can reach PostgreSQL, instead of spending a connect timeout on each claim while
their leases wait. After ``retry_after`` seconds it tries a claim again; any claim that gets
an answer clears the mark. Per process: each pool process learns for itself.
"""

from __future__ import annotations

import time

_cut_off_at: float | None = None


def cut_off() -> None:
    global _cut_off_at
    _cut_off_at = time.monotonic()


def reached() -> None:
    global _cut_off_at
    _cut_off_at = None


def recently_cut_off(retry_after: float) -> bool:
    at = _cut_off_at
    return at is not None and time.monotonic() - at < retry_after
