"""``dtask.pickup``: the runs single submits left to a pickup (where the broker is Redis:
``dtask.worker.masters.ask_pickup``). A submit inserts its run marked as waiting for a
pickup and asks for one unless one is asked for already; this task forgets the ask, then
reads the runs waiting, the highest priority and oldest first, marks them picked up, runs
as many of one template here as a master would take with its own, and sends the others'
masters several runs to a message. So a burst of submits makes a few messages, not one per
run, and their runs are split and finished together
(``dtask.worker.inline_runs.run_many``); one submit at a time costs its message, as before.

The ask is a Redis key set only where absent, after the submit's commit; this task deletes
it before it reads. A submit that found the key set committed before the task that deletes
it reads the runs: its run is read by that task or a later one. A pickup message lost with
the broker leaves the key until it expires (the next submit asks again, and its pickup reads
every run waiting); the reaper sends the masters of runs pending too long, as for any lost
master."""

from __future__ import annotations

import logging
from itertools import groupby

from dtask import services
from dtask.domain.dispatch import batch_size
from dtask.worker import drain
from dtask.worker.inline_runs import child_seconds, run_many, together
from dtask.worker.masters import (
    MOST_PICKED,
    PER_MESSAGE,
    Master,
    ask_pickup,
    forget_ask,
    send_masters,
)
from dtask.worker.task_table import PICKUP
from dtask.worker.tasks import dtask_task

log = logging.getLogger("dtask.worker")


@dtask_task(PICKUP)
def pickup() -> None:
    """Take the runs waiting for a pickup: as many of the first template's whose one-child
    runs this process has seen take less than BATCH_SECONDS as fill it are run here, as a
    master takes its siblings (``run_many``); the others' masters are sent first, several runs
    to a message, for any process to take."""
    drain.arm()
    try:
        forget_ask()  # before the read: see the module's docstring
        picked = services.store().runs.pick_up(MOST_PICKED)
        if len(picked) == MOST_PICKED:  # more may wait: another pickup reads them
            ask_pickup(max(priority for _, _, priority in picked))
        here: list[Master] = []
        others: list[Master] = []
        for (template, priority), runs in groupby(picked, key=lambda r: (r[1], r[2])):
            masters = [
                Master(run_id, template, priority, shown=f"{template} run {run_id} picked up")
                for run_id, _, _ in runs
            ]
            seen = child_seconds(template)
            if not here and seen is not None and together(template) and not drain.draining():
                fits = batch_size(seen)
                here, masters = masters[:fits], masters[fits:]
            others.extend(masters)
        send_masters(others, PER_MESSAGE)
        left = set(run_many(services.store(), [m.run_id for m in here])) if here else set()
        send_masters([m for m in here if m.run_id in left], PER_MESSAGE)
        log.info("picked up %s runs, %s run here", len(picked), len(here) - len(left))
    finally:
        drain.finished()
