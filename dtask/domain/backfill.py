"""A schedule's slots as runs: what the beat fires as they come and what a backfill fires for
a range of past (or future) slots, built alike so that a slot has one run whichever made it
(its trigger key, ``schedule:<name>:<slot>``). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from dtask.domain.clients import DEFAULT_CLIENT, Client
from dtask.domain.concurrency import run_limit
from dtask.domain.runs import NewRun
from dtask.domain.schedules import Schedule, iso, trigger_key
from dtask.domain.templates import registry
from dtask.exceptions import InvalidSchedule

MOST_SLOTS = 10_000  # a backfill's slots at most: a wider range is a typo more often than not


def slot_runs(schedule: Schedule, slots: Sequence[datetime], max_children: int) -> list[NewRun]:
    """The runs of ``slots``, checked again as they fire: the template's code may have changed
    since the schedule was saved. A slot's run is the default client's."""
    tpl = registry.get(schedule.template)
    variables = tpl.validate(schedule.variables)
    tpl.precheck(variables, max_children)
    timing = schedule.timing
    limit = run_limit(tpl.options.concurrency, variables, f"schedule {schedule.name!r}")
    return [
        NewRun(
            template=tpl.name,
            key=trigger_key(schedule.name, slot),
            variables=variables,
            max_attempts=tpl.options.max_attempts,
            queue=tpl.options.queue,
            schedule=schedule.name,
            slot=slot,
            # the deadline: slot + tolerance
            delay_tolerance=timing.delay_tolerance or tpl.options.delay_tolerance,
            on_late=timing.on_late or tpl.options.on_late,
            tier=tpl.options.tier,
            **limit,
        ).charged_to(Client(DEFAULT_CLIENT))
        for slot in slots
    ]


def backfill_slots(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The schedule's slots from ``start`` to ``end`` (both included, aware), oldest first,
    within its own start and end; InvalidSchedule for a range that is empty the wrong way
    round or holds over MOST_SLOTS."""
    if start.tzinfo is None or end.tzinfo is None:
        raise InvalidSchedule("a backfill's --from and --to need a time zone (or the schedule's)")
    if end < start:
        raise InvalidSchedule(f"a backfill's --to ({iso(end)}) is before its --from ({iso(start)})")
    found = schedule.timing.slots(start - timedelta(microseconds=1), end, MOST_SLOTS + 1)
    if len(found) > MOST_SLOTS:
        raise InvalidSchedule(
            f"{iso(start)} to {iso(end)} holds over {MOST_SLOTS:,} slots of schedule"
            f" {schedule.name!r}: backfill a shorter range at a time"
        )
    return found
