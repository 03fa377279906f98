"""Why a run waits, on the CLI: a line in `dtask status`, and under `--wait`/`--watch` a line
each time the reason changes."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from dtask.domain.clients import Tier
from dtask.domain.runs import RunStatus
from dtask.domain.waiting import Waiting
from dtask.exceptions import DtaskError

LOOK_EVERY = 2.0  # seconds between two looks at the reason while waiting (a few small reads)
SAME_REASON_EVERY = 30.0  # its numbers moved: said again at most this often


def why(run_id: int) -> Waiting | None:
    from dtask.client.waiting import why

    return why(run_id)


class Reasons:
    """Call with each new status while waiting: prints ``run N: <why it waits>`` when the
    reason changes (its numbers alone: at most every SAME_REASON_EVERY seconds), and ``run N:
    nothing holds it now`` when nothing does any more."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.looked = -LOOK_EVERY
        self.said_at = 0.0
        self.said: Waiting | None = None

    def __call__(self, status: RunStatus) -> None:
        now = time.monotonic()
        if status.finished or now - self.looked < LOOK_EVERY:
            return
        self.looked = now
        try:
            waiting = why(status.id)
        except DtaskError:  # the reason is a courtesy: the wait goes on without it
            return
        if waiting == self.said:
            return
        moved = waiting is not None and self.said is not None and waiting.reason == self.said.reason
        if moved and now - self.said_at < SAME_REASON_EVERY:
            return
        if waiting is not None:
            self._say(f"run {status.id}: {waiting.text}")
        elif self.said is not None:
            self._say(f"run {status.id}: nothing holds it now")
        self.said, self.said_at = waiting, now

    def _say(self, line: str) -> None:
        clear = "\r\x1b[2K" if self.stream.isatty() else ""  # above a redrawn progress bar
        self.stream.write(f"{clear}{line}\n")
        self.stream.flush()


def warn_if_nobody_consumes(run_id: int) -> None:
    from dtask import services
    from dtask.client.workers import slots_for
    from dtask.domain.tiers import DEFAULT_QUEUE, base_queue

    record = services.store().runs.get(run_id)
    name = record.queue or DEFAULT_QUEUE
    if slots_for(name) == 0:
        start = "dtask worker"
        if base_queue(name) != DEFAULT_QUEUE:
            start += f" -Q {base_queue(name)}"
        if record.tier is not Tier.BASIC:
            start += f" --tier {record.tier.value}"
        print(
            f"dtask: note: no live worker consumes queue {name!r}; run {run_id} waits until one"
            f" starts (`{start}`{', or `dtask up`' if start == 'dtask worker' else ''})",
            file=sys.stderr,
        )
