"""Straggler stealing's child side (docs/elastic.md; the dispatcher asks, ``dispatcher.ask``):
a child that gave its rest away makes the new child known to the chord and to the
dispatcher."""

from __future__ import annotations

import logging

from dtask.db.steals import Gift
from dtask.worker import dispatcher
from dtask.worker.app import current
from dtask.worker.child_store import LifecycleStore, hand_over
from dtask.worker.messages import chords

log = logging.getLogger("dtask.worker")


def after_gift(store: LifecycleStore, run_id: int, gift: Gift, deferred: bool) -> None:
    """The new child, committed with the cut, goes out: the chord counts one part more (a
    result backend that cannot be told leaves the run to its last child, which finalizes it
    from PostgreSQL's counts), and the dispatcher sends it now (or, with every child sent at
    once, it is sent here)."""
    if gift.group_id is not None and chords():
        try:
            current().backend.set_chord_size(gift.group_id, gift.chord_size)
        except Exception as exc:
            log.warning("run %s: the chord was not told of child %s: %s", run_id, gift.index, exc)
    if deferred:
        dispatcher.nudge()
    else:
        hand_over(store, run_id, gift.template, [(gift.index, gift.spec)])
    log.info("run %s: child %s runs the rest a straggler gave away", run_id, gift.index)
