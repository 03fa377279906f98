"""Submit one raw Celery chord of N trivial children and wait on the callback's own
AsyncResult (not the chord's: DESIGN.md). Prints one JSON line: seconds, sent, peak RSS.

    python -m bench.raw_client N [--chunks K]

With ``--chunks K`` the children go K to a task, as an expert hand-writes it for tiny tasks:
``child.chunks(..., K)`` as a group under the chord (one result per chunk, no record, retry
or checkpoint per child).
"""

from __future__ import annotations

import json
import resource
import sys
import time

from celery import chord
from celery.result import AsyncResult

from bench.raw_app import app, child, done, done_chunks


def main() -> int:
    n = int(sys.argv[1])
    size = int(sys.argv[3]) if sys.argv[2:3] == ["--chunks"] else 0
    child.apply_async(args=(0, 0)).get(timeout=60)  # the worker is up and connected
    start = time.perf_counter()
    if size:
        pairs = [(i, i) for i in range(1, n + 1)]
        callback = chord(child.chunks(pairs, size).group())(done_chunks.s())
    else:
        callback = chord(child.s(i, i) for i in range(1, n + 1))(done.s())
    sent = time.perf_counter() - start
    counted = AsyncResult(callback.id, app=app).get(timeout=1800)
    seconds = time.perf_counter() - start
    assert counted == n, counted
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "sent": sent, "rss_mb": rss_mb}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
