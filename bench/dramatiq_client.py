"""Send one Dramatiq group of N no-op children with a completion callback, and wait for the
callback to have run. Prints one JSON line: seconds (enqueue to callback), sent.

    python -m bench.dramatiq_client N
"""

from __future__ import annotations

import json
import sys
import time
import uuid

import dramatiq

from bench.dramatiq_app import child, done, store


def main() -> int:
    n = int(sys.argv[1])
    key = f"dramatiq-bench-done-{uuid.uuid4().hex}"
    warm = f"{key}-warm"
    group = dramatiq.group([child.message(0, 0)])
    group.add_completion_callback(done.message(warm))
    group.run()
    _wait(warm, 60)  # the workers are up and consuming
    start = time.time()
    group = dramatiq.group(child.message(i, i) for i in range(1, n + 1))
    group.add_completion_callback(done.message(key))
    group.run()
    sent = time.time() - start
    finished = _wait(key, 1800)
    print(json.dumps({"seconds": finished - start, "sent": sent}), flush=True)
    return 0


def _wait(key: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = store.get(key)
        if value is not None:
            return float(value)
        time.sleep(0.05)
    raise SystemExit(f"no completion callback for {key} after {timeout} s")


if __name__ == "__main__":
    sys.exit(main())
