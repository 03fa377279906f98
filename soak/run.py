"""`make soak`: the chaos soak (issue 15), also called by tests/acceptance/test_soak.py.

    make soak                         # 10 minutes of faults, then the table
    make soak MINUTES=30 SEED=7       # longer, another random sequence
    make soak DISPATCH=window         # the workers with DTASK_DISPATCH=window
    .venv/bin/python -m soak.run --minutes 2 --seed 1

While runs of many sizes, an interval schedule, cancels and reruns keep arriving, a fault
from soak.faults.DEFAULT_FAULTS is injected every 3 to 9 s (dealt in shuffled rounds, each
fault ``weight`` times a round, so every kind comes up). Then faults and arrivals
stop, every cancelled run is rerun, the cluster gets ``--settle`` seconds to finish, and the
invariants are checked (soak/checks.py). Exit status 0 only when all of them hold.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from soak import netns
from soak.cluster import FAST, REPO, Cluster
from soak.faults import DEFAULT_FAULTS, Fault, FaultContext, Injection

log = logging.getLogger("soak")
SCHEDULE_EVERY = 5
SCHEDULE_GRACE = 10


class Soak:
    def __init__(
        self,
        env: dict[str, str],
        logs: Path,
        *,
        minutes: float,
        seed: int,
        faults: Sequence[Fault] = DEFAULT_FAULTS,
        fault_gap: tuple[float, float] = (3.0, 9.0),
        max_n: int = 2500,
        settle: float = 240,
    ) -> None:
        import soak.templates  # noqa: F401  (registered here too: this process submits)

        self.env = env
        self.sink = Path(env["DTASK_SOAK_SINK"])
        self.seconds = minutes * 60
        self.rng = random.Random(seed)
        self.seed = seed
        self.faults = list(faults)
        why_not = netns.unavailable() if any(f.needs_partitions for f in faults) else None
        if why_not is not None:
            print(f"soak: no link cuts: {why_not}", flush=True)
            self.faults = [f for f in self.faults if not f.needs_partitions]
        self.fault_gap = fault_gap
        self.max_n = max_n
        self.settle = settle
        partitioned = any(f.needs_partitions for f in self.faults)
        self.cluster = Cluster(env, logs, workers=3, beats=2, partitioned=partitioned)
        self.variables: dict[int, dict[str, Any]] = {}
        self.cancels: Counter[int] = Counter()
        self.reruns_due: list[tuple[float, int]] = []
        self.injections: list[Injection] = []
        self.heals: list[tuple[float, Injection]] = []
        self.outages: list[tuple[float, float]] = []
        self.refused = 0

    def _submit(self, template: str, variables: dict[str, Any]) -> int | None:
        import dtask

        try:
            run_id = dtask.submit(template, variables).id
        except dtask.DtaskError as exc:  # a service restarting: the client was told so
            self.refused += 1
            log.info("submit refused: %s", exc)
            return None
        self.variables[run_id] = variables
        return run_id

    def _size(self) -> int:
        bucket = self.rng.choices([(1, 49), (50, 300), (300, 1500), (2500, 2500)], [4, 3, 2, 1])[0]
        return min(self.rng.randint(*bucket), self.max_n)

    def run(self) -> Any:
        import dtask
        from soak.checks import Verdict
        from soak.monitor import Monitor

        first = self._first_run_id()
        schedule = f"soak-pulse-{first}"
        dtask.add_schedule(
            schedule, "soak_range", {"n": 30, "delay": 0.01},
            every=SCHEDULE_EVERY, grace=SCHEDULE_GRACE,
        )  # fmt: skip
        self.cluster.start()
        monitor = Monitor(self.cluster, first)
        monitor.start()
        ctx = FaultContext(
            self.cluster, monitor, self.rng,
            lambda: self._submit("soak_broken_split", {"n": 1}), self.outages, schedule,
        )  # fmt: skip
        try:
            self._chaos(ctx, dtask)
            end = time.time()
            dtask.pause_schedule(schedule)
            self._settle(monitor, dtask)
            dtask.remove_schedule(schedule)  # its runs stay
        finally:
            for _, inj in self.heals:
                if inj.heal:
                    inj.heal()
            monitor.stop()
            self.cluster.stop()
        runs = {i: r for i, r in monitor.snapshot.runs.items() if r.template.startswith("soak_")}
        for run_id, run in runs.items():
            if run.schedule == schedule:
                self.variables.setdefault(run_id, {"n": 30, "delay": 0.01})
        verdict = Verdict(
            runs, self.variables, self.sink, monitor, self.injections, self.cancels,
            (schedule, SCHEDULE_EVERY, SCHEDULE_GRACE, end, self.outages),
        )  # fmt: skip
        return verdict.outcome()

    def _first_run_id(self) -> int:
        from sqlalchemy import text

        from dtask import services

        with services.store().engine.connect() as conn:
            last = conn.execute(text("SELECT coalesce(max(id), 0) FROM dtask_runs")).scalar_one()
        return int(last) + 1

    def _chaos(self, ctx: FaultContext, dtask: Any) -> None:
        start = time.monotonic()
        next_submit = next_cancel = start
        next_fault = start + self.rng.uniform(*self.fault_gap)
        deck: list[Fault] = []
        while (now := time.monotonic()) < start + self.seconds:
            if now >= next_submit:
                delay = self.rng.uniform(0.02, 0.05)
                self._submit("soak_range", {"n": self._size(), "delay": delay})
                next_submit = now + self.rng.uniform(3, 7)  # ~60 % of 6 processes
            if now >= next_cancel:
                self._cancel_one(ctx, dtask)
                next_cancel = now + self.rng.uniform(8, 20)
            self._rerun_due(dtask, now)
            self._heal_due(now)
            if now >= next_fault:
                if not deck:  # every kind comes up, ``weight`` times per round, in random order
                    deck = [f for f in self.faults for _ in range(max(1, round(f.weight)))]
                    self.rng.shuffle(deck)
                fault = deck.pop()
                if not self._inject(fault, ctx):
                    deck.insert(0, fault)  # nothing to aim at now: it comes up again later
                next_fault = time.monotonic() + self.rng.uniform(*self.fault_gap)
            self._replace_dead()
            time.sleep(0.1)

    def _inject(self, fault: Fault, ctx: FaultContext) -> bool:
        try:
            inj = fault.inject(ctx)
        except Exception as exc:  # a fault the harness could not inject is not a dtask bug
            log.warning("could not inject %s: %s", fault.kind, exc)
            return False
        if inj is None:
            return False
        self.injections.append(inj)
        log.warning("fault %d: %s (%s), %d children hit", len(self.injections), inj.kind,
                    inj.detail, len(inj.affected))  # fmt: skip
        if inj.heal:
            self.heals.append((inj.at + inj.heal_after, inj))
        return True

    def _heal_due(self, now: float) -> None:
        for due, inj in [h for h in self.heals if h[0] <= now]:
            self.heals.remove((due, inj))
            if inj.heal:
                inj.heal()

    def _replace_dead(self) -> None:
        """A process that died (not by our hand) is replaced; the checks see it in the logs."""
        for role, wanted in zip(("worker", "beat"), self.cluster.sizes, strict=True):
            for _ in range(wanted - len(self.cluster.live(role))):
                log.warning("a %s died by itself; starting another", role)
                self.cluster.spawn(role)

    def _cancel_one(self, ctx: FaultContext, dtask: Any) -> None:
        snap = ctx.monitor.snapshot
        running = [
            i
            for i, r in snap.runs.items()
            if r.template == "soak_range" and r.state == "running" and not r.schedule
        ]
        if not running:
            return
        run_id = self.rng.choice(running)
        try:
            dtask.get_run(run_id).cancel()
        except dtask.DtaskError as exc:
            log.info("cancel of run %s refused: %s", run_id, exc)
            return
        self.cancels[run_id] += 1
        self.reruns_due.append((time.monotonic() + self.rng.uniform(0.5, 5), run_id))

    def _rerun_due(self, dtask: Any, now: float) -> None:
        for due, run_id in [r for r in self.reruns_due if r[0] <= now]:
            try:
                dtask.get_run(run_id).rerun()
            except dtask.DtaskError as exc:
                log.info("rerun of run %s failed, trying again: %s", run_id, exc)
                continue
            self.reruns_due.remove((due, run_id))

    def _settle(self, monitor: Any, dtask: Any) -> None:
        """Faults and arrivals stop; reruns go out; the cluster finishes what it has."""
        for _, inj in self.heals:
            if inj.heal:
                inj.heal()
        self.heals.clear()
        began = time.monotonic()
        deadline = began + self.settle
        while time.monotonic() < deadline:
            self._rerun_due(dtask, float("inf"))
            self._replace_dead()
            snap = monitor.snapshot
            runs = snap.runs.values()
            # a snapshot from before the last submission may not hold that run yet: one taken
            # since settling began does (else a run submitted at the end was left running)
            if (
                snap.at > began
                and not self.reruns_due
                and all(
                    r.state in ("succeeded", "failed")
                    for r in runs
                    if r.template.startswith("soak_")
                )
            ):
                return
            time.sleep(0.5)


def prepare_environment(work: Path, dispatch: str = "window") -> dict[str, str]:
    """A fresh DTASK_HOME; must run before dtask touches its services."""
    for name in [n for n in os.environ if n.startswith("DTASK_")]:
        del os.environ[name]
    (work / "sink").mkdir(parents=True)
    (work / "logs").mkdir()
    os.environ.update(
        DTASK_HOME=str(work / "home"),
        DTASK_TEMPLATES="soak.templates",
        DTASK_SOAK_SINK=str(work / "sink"),
        PYTHONPATH=str(REPO),
        DTASK_DISPATCH=dispatch,
        **FAST,
    )
    return dict(os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    parser.add_argument("--settle", type=float, default=240)
    parser.add_argument(
        "--dispatch",
        choices=["all", "window"],
        default="window",
        help="the workers' DTASK_DISPATCH (default: window, as shipped)",
    )
    args = parser.parse_args(argv)
    # a SIGTERM (a CI's timeout, `kill`) still stops the cluster and removes the namespaces
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    work = Path(tempfile.mkdtemp(prefix="dtask-soak-"))
    env = prepare_environment(work, args.dispatch)
    print(f"soak: seed {args.seed}, {args.minutes:g} min, logs and sink in {work}", flush=True)
    from dtask import services
    from dtask.services import embedded

    services.store()  # start the embedded services and migrate
    try:
        outcome = Soak(
            env, work / "logs", minutes=args.minutes, seed=args.seed, settle=args.settle
        ).run()
    finally:
        services.reset()
        embedded.stop(Path(env["DTASK_HOME"]))
    print(f"\nsoak: seed {args.seed}, {args.minutes:g} min\n\n{outcome.table()}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
