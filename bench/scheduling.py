"""Who gets the slots: child starts over time for two clients' large runs, and for an urgent
run behind a backlog, on 2 dtask workers x 2 processes with the default dispatcher.

    python -m bench.scheduling        # ~2 minutes; writes docs/benchmarks/scheduling.png

Prints the figures docs/scheduling.md quotes (the issue's fairness and priority tests at full
size: two 2,000-child runs 5 s apart; a priority-9 run behind a 3,000-child backlog).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.cluster import REPO, Workers, prepare_environment

PLOT = REPO / "docs" / "benchmarks" / "scheduling.png"
CHILD = 0.05  # seconds per child: 4 slots start about 80 children a second


def main() -> int:
    work = prepare_environment()
    import dtask
    from dtask import services

    engine = services.store().engine
    workers = Workers(work)
    for _ in range(2):
        workers.dtask(2)
    workers.ready()
    try:
        fair = _fairness(dtask, engine)
        urgent = _priority(dtask, engine)
    finally:
        from dtask.services import embedded

        workers.stop_all()
        services.reset()
        embedded.stop(work / "home")
    _plot(fair, urgent, PLOT)
    print(f"plot: {PLOT.relative_to(REPO)} (work dir {work})")
    return 0


def _starts(engine: Any, run_id: int) -> list[datetime]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT started_at FROM dtask_children WHERE run_id = :r"
                " AND started_at IS NOT NULL ORDER BY started_at"
            ),
            {"r": run_id},
        )
        return [r.started_at for r in rows]


def _submitted(engine: Any, run_id: int) -> datetime:
    from sqlalchemy import text

    with engine.connect() as conn:
        at: datetime = conn.execute(
            text("SELECT created_at FROM dtask_runs WHERE id = :r"), {"r": run_id}
        ).scalar_one()
        return at


def _fairness(dtask: Any, engine: Any) -> dict[str, Any]:
    for name in ("client-a", "client-b"):
        dtask.set_client(name)
    a = dtask.submit("bench_sleep", {"n": 2000, "delay": CHILD}, client="client-a")
    time.sleep(5)
    b = dtask.submit("bench_sleep", {"n": 2000, "delay": CHILD}, client="client-b")
    for run in (a, b):
        run.wait(timeout=600)
    sa, sb = _starts(engine, a.id), _starts(engine, b.id)
    first_b = sb[0]
    waited = (first_b - _submitted(engine, b.id)).total_seconds()
    # while both have children waiting: from B's first start until either has started all
    until = min(sa[-1], sb[-1])
    window = [("a", t) for t in sa if first_b <= t <= until] + [
        ("b", t) for t in sb if first_b <= t <= until
    ]
    share = sum(1 for who, _ in window if who == "b") / max(1, len(window))
    print(
        f"fairness: client B's first child {waited:.2f} s after its submit; while both waited,"
        f" B had {share:.1%} of {len(window)} child starts"
    )
    return {"a": sa, "b": sb, "submits": [_submitted(engine, a.id), _submitted(engine, b.id)]}


def _priority(dtask: Any, engine: Any) -> dict[str, Any]:
    backlog = dtask.submit("bench_sleep", {"n": 3000, "delay": CHILD}, priority=2)
    while len(_starts(engine, backlog.id)) < 200:
        time.sleep(0.1)
    urgent = dtask.submit("bench_sleep", {"n": 200, "delay": CHILD}, priority=9)
    urgent.wait(timeout=600)
    su = _starts(engine, urgent.id)
    done_then = backlog.status().children.succeeded
    waited = (su[0] - _submitted(engine, urgent.id)).total_seconds()
    print(
        f"priority: the priority-9 run's first child {waited:.2f} s after its submit; it"
        f" finished with the backlog at {done_then}/3000"
    )
    backlog.wait(timeout=900)
    sb = _starts(engine, backlog.id)
    return {
        "backlog": sb,
        "urgent": su,
        "submits": [_submitted(engine, backlog.id), _submitted(engine, urgent.id)],
    }


def _plot(fair: dict[str, Any], urgent: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for axis, data, series, title in (
        (left, fair, (("a", "client A"), ("b", "client B, 5 s later")), "two clients, 2,000 each"),
        (
            right,
            urgent,
            (("backlog", "priority 2, 3,000"), ("urgent", "priority 9, 200")),
            "an urgent run behind a backlog",
        ),
    ):
        zero = data["submits"][0]
        for key, label in series:
            xs = [(t - zero).total_seconds() for t in data[key]]
            axis.plot(xs, range(1, len(xs) + 1), label=label)
        for at in data["submits"][1:]:
            axis.axvline((at - zero).total_seconds(), color="grey", linestyle=":")
        axis.set_title(title)
        axis.set_xlabel("seconds since the first submit")
        axis.set_ylabel("children started")
        axis.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
