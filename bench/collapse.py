"""Summarise a py-spy ``--format raw --subprocesses`` profile of a worker: per process kind
(the worker's main process, its pool processes), the frames with the most inclusive samples
(minus the frames every sample shares) and the most self samples. Waiting threads (the
reaper's and heartbeat's timers) are left out.

    python -m bench.collapse PROFILE [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_PROCESS = re.compile(r"^process (\d+):")
_IDLE = ("Condition.wait", "Event.wait")


def summarise_roles(path: str, roles: dict[int, str] | None = None, top: int = 15) -> str:
    samples: collections.Counter[str] = collections.Counter()
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    own: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(path) as profile:
        for line in profile:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            depth = sum(1 for f in frames if _PROCESS.match(f))
            body = [f for f in frames if not _PROCESS.match(f) and not f.startswith("thread ")]
            if not body or any(f.startswith(_IDLE) for f in body):
                continue
            kind = "worker main process" if depth <= 1 else "pool processes"
            n = int(count)
            samples[kind] += n
            own[kind][body[-1]] += n
            for frame in set(body):
                inclusive[kind][frame] += n
    lines = []
    for kind, total in samples.most_common():
        lines.append(f"{kind}: {total} samples")
        shared = [f for f, n in inclusive[kind].items() if n > 0.97 * total]
        lines.append("  inclusive:")
        ranked = [(f, n) for f, n in inclusive[kind].most_common() if f not in shared]
        lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in ranked[:top]]
        lines.append("  self:")
        lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in own[kind].most_common(top // 2)]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(summarise_roles(args.profile, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
