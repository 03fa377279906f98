"""How long a fault stopped a run of the ``tagged`` template (one child per item, each writing
its start time to the sink): the longest pause in child starts after the fault."""

from __future__ import annotations

import itertools
from pathlib import Path


def pause_after(sink: Path, run_id: int, fault_at: float) -> tuple[float, float]:
    """(the longest pause in child starts from ``fault_at`` on, when starts resumed after it,
    in seconds after the fault). Children of messages taken before the fault run on; the
    pause is the broker's."""
    starts = sorted(float(f.read_text().split()[1]) for f in sink.glob(f"{run_id}-*.txt"))
    later = [fault_at, *(t for t in starts if t > fault_at)]
    pause, resumed = max((b - a, b) for a, b in itertools.pairwise(later))
    return pause, resumed - fault_at
