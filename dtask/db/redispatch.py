"""A child message to send again, with its original identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row


@dataclass(frozen=True)
class Redispatch:
    """Everything needed to re-send one child message with its original identity."""

    run_id: int
    index: int
    spec: dict[str, Any]
    template: str
    group_id: str
    queue: str | None


def redispatch_from_row(row: Row[Any]) -> Redispatch:
    return Redispatch(
        run_id=int(row.run_id),
        index=int(row._mapping["index"]),
        spec=row.spec,
        template=row.template,
        group_id=row.group_id,
        queue=row.queue,
    )
