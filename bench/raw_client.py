"""Submit one raw Celery chord of N trivial children and wait on the callback's own
AsyncResult (not the chord's: DESIGN.md). Prints one JSON line: seconds, sent, peak RSS.

    python -m bench.raw_client N
"""

from __future__ import annotations

import json
import resource
import sys
import time

from celery import chord
from celery.result import AsyncResult

from bench.raw_app import app, child, done


def main() -> int:
    n = int(sys.argv[1])
    child.apply_async(args=(0, 0)).get(timeout=60)  # the worker is up and connected
    start = time.perf_counter()
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
