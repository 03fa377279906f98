"""The input fuzz for as long as you give it (not part of `make test`, whose runs are short):

    .venv/bin/python -m tests.fuzz --minutes 10

Runs the fuzz of every surface (tests/acceptance/test_fuzz_surfaces.py), of shapes
(tests/acceptance/test_fuzz_shapes.py) and the readers' property tests
(tests/unit/test_bad_shapes.py) in rounds, each a pytest process with its own embedded
services, its own hypothesis seed and DTASK_FUZZ_EXAMPLES examples a test, until the minutes
are spent; then prints what each call became, by surface: ok, refused (one line, nothing
created), traceback, http500, created (a refused call that left rows). Exit 1 when a round
failed or any call was a traceback, a 500 or a refusal that created something."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = [
    "tests/acceptance/test_fuzz_surfaces.py",
    "tests/acceptance/test_fuzz_shapes.py",
    "tests/unit/test_bad_shapes.py",
]
BAD = ("traceback", "http500", "created")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--examples", type=int, default=150, help="examples a test, a round")
    parser.add_argument("--seed", type=int, default=None, help="of the first round's seed")
    parser.add_argument("--keep", type=Path, default=None, help="folder for rounds' output")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="dtask-fuzz-"))
    folder.mkdir(parents=True, exist_ok=True)
    tally = folder / "tally.json"
    tally.unlink(missing_ok=True)
    seeds = random.Random(args.seed)
    budget = args.minutes * 60
    started = time.monotonic()
    rounds: list[tuple[int, int, float]] = []  # (seed, exit code, seconds)
    while not rounds or time.monotonic() - started + _longest(rounds) <= budget:
        seed = seeds.randrange(2**32)
        log = folder / f"round-{len(rounds) + 1}.log"
        began = time.monotonic()
        with log.open("w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 f"--basetemp={folder / f'bt-{len(rounds) + 1}'}",
                 f"--hypothesis-seed={seed}", *FILES],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False,
                env={**os.environ, "DTASK_FUZZ_EXAMPLES": str(args.examples),
                     "DTASK_FUZZ_TALLY": str(tally)},
            )  # fmt: skip
        rounds.append((seed, done.returncode, time.monotonic() - began))
        print(
            f"round {len(rounds)}: seed {seed}, exit {done.returncode},"
            f" {rounds[-1][2]:.0f} s ({log})",
            flush=True,
        )
    counts = Counter(json.loads(tally.read_text())) if tally.exists() else Counter()
    return _report(counts, rounds, time.monotonic() - started)


def _longest(rounds: list[tuple[int, int, float]]) -> float:
    return max(seconds for _, _, seconds in rounds)


def _report(counts: Counter[str], rounds: list[tuple[int, int, float]], spent: float) -> int:
    surfaces = sorted({key.rsplit(" ", 1)[0] for key in counts})
    outcomes = ["ok", "refused", *BAD]
    width = max([len(s) for s in surfaces] + [7])
    print(f"\n{'surface':<{width}}  {'calls':>7}  " + "  ".join(f"{o:>9}" for o in outcomes))
    total: Counter[str] = Counter()
    for surface in surfaces:
        row = {o: counts[f"{surface} {o}"] for o in outcomes}
        total.update(row)
        calls = sum(row.values())
        print(f"{surface:<{width}}  {calls:>7,}  " + "  ".join(f"{row[o]:>9,}" for o in outcomes))
    calls = sum(total.values())
    print(f"{'all':<{width}}  {calls:>7,}  " + "  ".join(f"{total[o]:>9,}" for o in outcomes))
    failed = [r for r in rounds if r[1] != 0]
    print(
        f"\n{len(rounds)} rounds in {spent / 60:.1f} min, {len(failed)} failed"
        + (f" (seeds {', '.join(str(r[0]) for r in failed)})" if failed else "")
    )
    return 1 if failed or any(total[o] for o in BAD) else 0


if __name__ == "__main__":
    raise SystemExit(main())
