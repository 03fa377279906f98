"""Cron expressions, evaluated by cronsim: Debian cron's rules, its DST handling included.

Pure: no Celery, no SQL. Five fields (``minute hour day-of-month month day-of-week``) or six
with seconds first; cronsim adds ``L``, ``LW``, ``5L`` and ``MON#2`` to the usual syntax, and
this module adds the ``@hourly`` ... ``@yearly`` macros.

Daylight saving time, for cron in a time zone (Debian cron's rule, as cronsim implements it):
- a five-field expression whose minute and hour fields do not start with ``*`` runs on wall
  time: a wall time skipped by a spring-forward jump fires at the first real minute after the
  gap (02:30 in Europe/Berlin on the last Sunday of March fires at 03:00 CEST), and a wall
  time that happens twice (fall back) fires once, at its first occurrence;
- any other expression (a ``*`` minute or hour field, or six fields) follows real time: both
  passes of a repeated hour, nothing in a skipped one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from dtask.exceptions import InvalidSchedule

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = "minute hour day-of-month month day-of-week, or 6 with seconds first"
_PROBE = datetime(2000, 1, 1, tzinfo=UTC)
MAX_EXPRESSION = 200  # dtask_schedules.cron
STEP_BUDGET = 10_000
_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)


class _Stuck(Exception):
    pass


class _Walk(CronSim):
    """CronSim with a step budget between two slots: its real-time walk can loop forever
    across a DST change that is not on the hour (``56 */3 * * *`` in Pacific/Chatham on
    2020-04-05), yielding nothing new. Sane walks take a few hundred steps per slot."""

    steps = 0

    def tick(self, seconds: int = 1) -> None:
        self.steps += 1
        if self.steps > STEP_BUDGET:
            raise _Stuck
        super().tick(seconds)


@dataclass(frozen=True)
class Cron:
    expression: str  # as written (stripped); a macro stays a macro

    @classmethod
    def parse(cls, expression: str) -> Cron:
        """The cron, or InvalidSchedule naming the expression and its bad field."""
        if len(expression) > MAX_EXPRESSION:
            raise InvalidSchedule(
                f"a cron expression is at most {MAX_EXPRESSION} characters, got {len(expression):,}"
            )
        cron = cls(expression.strip())
        try:
            CronSim(cron.fields, _PROBE)
        except CronSimError as error:
            raise InvalidSchedule(cron._problem(str(error))) from None
        return cron

    @property
    def fields(self) -> str:
        return MACROS.get(self.expression.lower(), self.expression)

    def describe(self) -> str:
        return f"cron {self.expression}"

    def explain(self) -> str | None:
        """In words, e.g. "At 02:00 every day"; None where cronsim cannot put it in words."""
        try:
            return CronSim(self.fields, _PROBE).explain()
        except Exception:  # an optional nicety: never let it break a listing
            return None

    def slots(self, after: datetime, tz: ZoneInfo) -> Iterator[datetime]:
        """The fire times strictly after ``after`` (aware), ascending, as aware UTC datetimes.

        Ends when cronsim finds no match in 50 years or time runs out at year 9999. Where
        cronsim gets stuck the walk resumes further on, so it may miss slots there.
        """
        latest = start = after.astimezone(UTC)
        skip = _MINUTE
        while True:
            walk = _Walk(self.fields, start.astimezone(tz))
            try:
                # On wall time cronsim forgets which pass of a repeated hour ``after`` is in,
                # so it can yield the first pass again, before ``after``: such times are
                # skipped. Compared in UTC: datetimes sharing a tzinfo ignore fold.
                for fired in walk:
                    if (slot := fired.astimezone(UTC)) > latest:
                        latest, skip, walk.steps = slot, _MINUTE, 0
                        yield slot
                return
            except _Stuck:  # resume a little further on, then ever further
                start, skip = max(start, latest) + skip, skip * 2
            except OverflowError:
                return

    def next_slot(self, after: datetime, tz: ZoneInfo) -> datetime | None:
        return next(self.slots(after, tz), None)

    def start_independent(self, tz: ZoneInfo, after: datetime, until: datetime) -> bool:
        """Whether a walk from any start in [after, until] gives the same slots up to ``until``.

        True where ``tz`` keeps one UTC offset, from a day before ``after`` (cronsim's walk
        steps back up to an hour) to ``until``. Across a DST change cronsim's real-time walk
        can depend on its start: after Lord Howe's 30-minute fall back, a walk from just
        after the change skips 03:00-03:29 for ``* 3 * * *``, one from 02:00 does not.
        """
        moment = after - _DAY
        offset = moment.astimezone(tz).utcoffset()
        while moment < until:
            moment = min(moment + _HOUR, until)
            if moment.astimezone(tz).utcoffset() != offset:
                return False
        return True

    def _problem(self, error: str) -> str:
        quoted = f"cron {self.expression!r}"
        parts = self.fields.split()
        if self.expression.startswith("@"):
            return f"{quoted}: unknown macro (use one of {' '.join(MACROS)})"
        if len(parts) not in (5, 6):
            return f"{quoted}: needs 5 fields, has {len(parts)} (fields: {FIELDS})"
        field = error.removeprefix("Bad ").strip()
        if field == "day-of-month" and self._valid_in_any_month(parts):
            return f"{quoted} never fires: no month in its month field has those days"
        return f"{quoted}: bad {field} field (fields: {FIELDS})"

    def _valid_in_any_month(self, parts: list[str]) -> bool:
        """Whether only the month field makes the days impossible (cronsim refuses 30 February)."""
        any_month = [*parts[:-2], "*", parts[-1]]
        try:
            CronSim(" ".join(any_month), _PROBE)
        except CronSimError:
            return False
        return True
