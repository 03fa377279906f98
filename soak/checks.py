"""The soak's verdict: invariants over what PostgreSQL, the sink files and the monitor saw,
and per fault kind how often it was injected, how fast the cluster recovered and what it cost."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from soak.faults import Injection
from soak.monitor import ChildKey, Monitor, RunObs
from soak.templates import CHUNK, MAX_ATTEMPTS


@dataclass(frozen=True)
class Invariant:
    name: str
    ok: bool
    detail: str


@dataclass
class Printed:
    """One child's sink file: its numbers, and the attempt of each start of the function."""

    numbers: list[int]
    starts: list[int]

    @classmethod
    def read(cls, path: Path) -> Printed:
        numbers: list[int] = []
        starts: list[int] = []
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("s "):
                    starts.append(int(line[2:]))
                elif line.strip().isdigit():
                    numbers.append(int(line))
        return cls(numbers, starts)


def child_ranges(n: int) -> list[tuple[int, int]]:
    return [(a, min(a + CHUNK - 1, n)) for a in range(1, n + 1, CHUNK)]


@dataclass
class Outcome:
    invariants: list[Invariant]
    faults: list[list[str]]
    lost: int
    reprinted: int

    @property
    def ok(self) -> bool:
        return all(i.ok for i in self.invariants)

    def table(self) -> str:
        rows = [["invariant", "result", "detail"]]
        rows += [[i.name, "PASS" if i.ok else "FAIL", i.detail] for i in self.invariants]
        return _markdown(rows) + "\n\n" + _markdown(self.faults)


def _markdown(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]  # fmt: skip
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


class Verdict:
    def __init__(
        self,
        runs: dict[int, RunObs],
        variables: dict[int, dict[str, float]],
        sink: Path,
        monitor: Monitor,
        injections: list[Injection],
        cancels: Counter[int],
        schedule: tuple[str, float, float, float, list[tuple[float, float]]],
    ) -> None:
        self.runs = runs
        self.variables = variables
        self.sink = sink
        self.monitor = monitor
        self.injections = injections
        self.cancels = cancels
        self.schedule = schedule
        self.printed: dict[ChildKey, Printed] = {}
        self.expected: dict[ChildKey, tuple[int, int]] = {}
        for run_id, run in runs.items():
            if run.template == "soak_range":
                for index, span in enumerate(child_ranges(int(variables[run_id]["n"]))):
                    self.printed[(run_id, index)] = Printed.read(sink / f"{run_id}-{index}.txt")
                    if run.state == "succeeded":
                        self.expected[(run_id, index)] = span

    def _lost(self, key: ChildKey) -> int:
        a, b = self.expected[key]
        return len(set(range(a, b + 1)) - set(self.printed[key].numbers))

    def _reprinted(self, key: ChildKey) -> int:
        numbers = self.printed[key].numbers
        return len(numbers) - len(set(numbers))

    def outcome(self) -> Outcome:
        lost = sum(self._lost(k) for k in self.expected)
        reprinted = sum(self._reprinted(k) for k in self.expected)
        invariants = [
            self._final_states(),
            self._ranges(lost, reprinted),
            self._attempts(),
            self._slots(),
            self._fences(),
            self._rss(),
        ]
        return Outcome(invariants, self._fault_rows(), lost, reprinted)

    def _final_states(self) -> Invariant:
        states = Counter(r.state for r in self.runs.values())
        wrong = [
            f"run {i} ({r.template}) {r.state}: {r.error}"
            for i, r in sorted(self.runs.items())
            if r.state not in ("succeeded", "failed")
            or (r.template == "soak_range" and r.state != "succeeded")
            or (r.template == "soak_broken_split" and "SoakSplitError" not in (r.error or ""))
        ]
        counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        detail = f"{len(self.runs)} runs: {counts}"
        detail += f"; {sum(self.cancels.values())} cancels, each rerun"
        return Invariant("every run reached its final state", not wrong, _with(detail, wrong))

    def _ranges(self, lost: int, reprinted: int) -> Invariant:
        total = sum(b - a + 1 for a, b in self.expected.values())
        wrong = [f"run {k[0]} child {k[1]}: {self._lost(k)} lost" for k in self.expected
                 if self._lost(k)]  # fmt: skip
        detail = f"{total:,} numbers in {len(self.expected)} children: {lost} lost,"
        detail += f" {reprinted} re-printed"
        return Invariant("every range printed completely", not wrong, _with(detail, wrong))

    def _attempts(self) -> Invariant:
        """Each start of the child function writes its attempt. A child ran too often when an
        attempt exceeds max_attempts, or one attempt number started twice: only a cancel's
        release gives an attempt back, and a fault gives back the first take of a child it
        hit (one taken with a message for the first time counts its attempt as it ends, so
        the take after a kill is attempt 1 again, docs/fault-tolerance.md)."""
        wrong = []
        starts = 0
        hit = {key for inj in self.injections for key in inj.affected}
        for key, printed in self.printed.items():
            starts += len(printed.starts)
            counts = Counter(printed.starts)
            repeats = sum(n - 1 for n in counts.values())
            given_back = self.cancels[key[0]] + (key in hit and counts[1] > 1)
            if max(printed.starts, default=0) > MAX_ATTEMPTS or repeats > given_back:
                wrong.append(f"run {key[0]} child {key[1]} starts {printed.starts}")
        most = max((max(p.starts, default=0) for p in self.printed.values()), default=0)
        detail = f"{starts} starts of {len(self.printed)} children, highest attempt {most}"
        return Invariant(f"no child ran more than max_attempts ({MAX_ATTEMPTS})", not wrong,
                         _with(detail, wrong))  # fmt: skip

    def _slots(self) -> Invariant:
        """Every slot of the interval schedule from its first to the end of the fault phase
        (less its grace) ran exactly once. A slot may be missing only where the misfire policy
        (skip, grace G) says so: when no beat could fire it within G (PostgreSQL down)."""
        name, every, grace, end, outages = self.schedule
        slots = Counter(r.slot for r in self.runs.values() if r.schedule == name and r.slot)
        twice = [f"{s:%H:%M:%S} ran {n} times" for s, n in sorted(slots.items()) if n > 1]
        if not slots:
            return Invariant("schedule: each slot once, none skipped", False, "no slot ran")
        first = min(slots)
        last = datetime.fromtimestamp(end - grace - every, UTC)
        missing, excused = [], 0
        slot = first
        while slot <= last:
            if slot not in slots:
                due = slot.timestamp() + grace
                if any(a <= due <= b for a, b in outages):
                    excused += 1
                else:
                    missing.append(f"{slot:%H:%M:%S} skipped")
            slot += timedelta(seconds=every)
        expected = int((last - first).total_seconds() // every) + 1
        detail = f"{len(slots)} slots ran ({expected} due by the end), {excused} skipped by misfire"
        wrong = twice + missing
        return Invariant("schedule: each slot once, none skipped", not wrong, _with(detail, wrong))

    def _fences(self) -> Invariant:
        m = self.monitor
        wrong = [f"run {r.child[0]} child {r.child[1]}: {r.seen} then {r.then}"
                 for r in m.regressions]  # fmt: skip
        detail = f"{m.polls} polls of {len(m.max_fence)} children"
        detail += f" ({m.failed_polls} failed: PostgreSQL down)"
        return Invariant("no fence went backwards", not wrong, _with(detail, wrong))

    def _rss(self) -> Invariant:
        """The witness worker (never killed whole) lives the whole soak: the median RSS (main
        and pool) of its last fifth may not exceed 1.5 x that of its second fifth + 20 MB."""
        samples = self.monitor.rss.get(self.monitor.cluster.witness().name, [])
        if len(samples) < 10:
            return Invariant("worker RSS bounded", False, f"only {len(samples)} samples")
        fifth = len(samples) // 5
        early = statistics.median(s for _, s in samples[fifth : 2 * fifth]) / 2**20
        late = statistics.median(s for _, s in samples[-fifth:]) / 2**20
        ok = late <= 1.5 * early + 20
        detail = f"witness worker: {early:.0f} MB early, {late:.0f} MB late"
        detail += f" ({len(samples)} samples)"
        return Invariant("worker RSS did not grow without bound", ok, detail)

    def _fault_rows(self) -> list[list[str]]:
        rows = [["fault", "injected", "recovered", "recovery median (s)", "recovery max (s)",
                 "children hit", "numbers lost", "re-printed"]]  # fmt: skip
        by_kind: dict[str, list[Injection]] = defaultdict(list)
        for inj in self.injections:
            by_kind[inj.kind].append(inj)
        for kind, injs in by_kind.items():
            times = [i.recovery for i in injs if i.recovery is not None]
            hit = {k for i in injs for k in i.affected if k in self.expected}
            rows.append([
                kind, str(len(injs)), str(len(times)),
                f"{statistics.median(times):.1f}" if times else "-",
                f"{max(times):.1f}" if times else "-",
                str(len({k for i in injs for k in i.affected})),
                str(sum(self._lost(k) for k in hit)),
                str(sum(self._reprinted(k) for k in hit)),
            ])  # fmt: skip
        return rows


def _with(detail: str, wrong: list[str]) -> str:
    if not wrong:
        return detail
    more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
    return f"{detail}; " + "; ".join(wrong[:3]) + more
