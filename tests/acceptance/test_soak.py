"""The chaos soak of `make soak` for 2 minutes (select it alone with `pytest -m soak`).

Real `dtask worker` and `dtask beat` processes on the session's embedded PostgreSQL and Redis;
every fault kind of soak.faults.DEFAULT_FAULTS comes up at least once; the soak's invariants
must all hold (soak/checks.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from soak.cluster import FAST
from soak.run import Soak

pytestmark = [pytest.mark.acceptance, pytest.mark.soak]


@pytest.mark.timeout(480)
def test_two_minutes_of_chaos_keep_every_invariant(
    dtask_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "sink").mkdir()
    (tmp_path / "logs").mkdir()
    env = {
        **dtask_env,
        **FAST,
        "DTASK_TEMPLATES": "soak.templates",
        "DTASK_SOAK_SINK": str(tmp_path / "sink"),
    }
    soak = Soak(
        env, tmp_path / "logs", minutes=2, seed=15, fault_gap=(3.0, 7.0), max_n=1500, settle=180
    )
    outcome = soak.run()
    print(outcome.table())
    kinds = {inj.kind for inj in soak.injections}
    assert len(kinds) == len(soak.faults), f"not every fault came up: {sorted(kinds)}"
    assert outcome.ok, outcome.table()
