"""docs/benchmarks/machines.png from bench/out/machines-*.json (make cluster): children started
per second against what the slots allow, with the moment a quarter of the workers died."""

from __future__ import annotations

import json
import sys

from bench.machines import OUT
from bench.report import PLOTS


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = [json.loads(p.read_text()) for p in sorted(OUT.glob("machines-*.json"))]
    if not found:
        print("no bench/out/machines-*.json: run python -m bench.machines first")
        return 1
    fig, axes = plt.subplots(len(found), 1, figsize=(8, 3.2 * len(found)), squeeze=False)
    for ax, r in zip(axes[:, 0], found, strict=True):
        ax.plot(r["started_each_second"], label="children started per second")
        ax.axhline(r["ideal_per_second"], color="grey", linestyle="--",
                   label=f"{r['slots']} slots / {r['child_seconds']} s")  # fmt: skip
        ax.axvline(r["killed_at_s"], color="red", linestyle=":",
                   label=f"{r['killed_workers']} of {r['workers']} workers SIGKILLed")  # fmt: skip
        ax.set_title(
            f"{r['profile']}: {r['workers']} x -P {r['pool']} -c {r['concurrency']},"
            f" {r['children']:,} children, {100 * r['utilization']:.0f} % of the slots used"
        )
        ax.set_xlabel("seconds after the submits")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOTS / "machines.png", dpi=90)
    print(f"wrote {PLOTS / 'machines.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
