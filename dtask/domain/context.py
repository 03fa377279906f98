"""What a child function sees: its place in the run, its checkpoint, and resume. No SQL here."""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from itertools import islice
from typing import Any, TypeVar

from dtask.domain.limits import json_bytes, json_problem
from dtask.domain.stealing import cut
from dtask.exceptions import ChildStopped, InvalidCheckpoint, LeaseLost

T = TypeVar("T")

CheckpointWriter = Callable[[Any], "bool | None"]  # True: asked to give work away


class Step(Enum):
    """What ``resume``'s next step is (``ChildContext.steps``)."""

    ITEM = "item"
    WRITE = "write"
    CUT = "cut"


@dataclass
class Stealable:
    """A range child's bounds ``[a, b]`` and how it gives the second half of its rest away
    (straggler stealing, docs/elastic.md): ``give(at)`` commits ``[a, at - 1]`` as its range
    and ``[at, b]`` as a new child's, and says whether it did."""

    a: int
    b: int
    give: Callable[[int], bool]


class _ChildLog(logging.LoggerAdapter[logging.Logger]):
    """``ctx.log``: each line names its template, run and child in the worker's log, and is
    kept with the attempt's output (``echo``) as ``LEVEL message``."""

    def __init__(
        self, logger: logging.Logger, extra: dict[str, Any], echo: Callable[[str], None] | None
    ) -> None:
        super().__init__(logger, extra)
        self.echo = echo

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        return f"{extra['template']} run {extra['run']} child {extra['child']}: {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if self.echo is not None and self.isEnabledFor(level):
            try:
                text = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):  # logging reports it in its own way below
                text = str(msg)
            self.echo(f"{logging.getLevelName(level)} {text}\n")
        super().log(level, msg, *args, **kwargs)


class ChildContext:
    """Handed to every child function as its first argument.

    ``checkpoint(state)`` commits free-form JSON state at once; ``checkpoint_state`` is the
    last committed state (what a re-run starts from). ``resume(items)`` is the convenience for
    sequences: it skips what an earlier attempt finished and checkpoints as it goes, at most
    every ``checkpoint_interval`` seconds or ``checkpoint_every`` items.

    ``state`` is a dict that ``resume`` commits with each of its checkpoints (and the finish):
    a result the child builds up item by item (a running total) belongs there, so that an
    attempt resumed after a failover starts from what the items it skips added up to, and
    returns the whole. A local variable would hold only what this attempt processed.
    """

    def __init__(
        self,
        *,
        run_id: int,
        index: int,
        attempt: int,
        checkpoint_state: Any,
        writer: CheckpointWriter,
        checkpoint_interval: float,
        checkpoint_every: int,
        stop_requested: Callable[[], bool] = lambda: False,
        lease_lost: Callable[[], bool] = lambda: False,
        template: str = "",
        max_checkpoint: int | None = None,
        stealable: Stealable | None = None,
        echo: Callable[[str], None] | None = None,
        output: Callable[[str], object] | None = None,
        max_output_line: int = 65_536,
        max_result: int | None = None,
    ) -> None:
        self.run_id = run_id
        self._echo = echo  # where ctx.log's lines are kept besides the log (the attempt's)
        self._output = output
        self.max_output_line = max_output_line  # DTASK_MAX_OUTPUT_LINE
        self.max_result = max_result  # DTASK_MAX_CHILD_RESULT
        self.index = index
        self.attempt = attempt
        self.template = template
        self._state = checkpoint_state
        self._writer = writer
        self._interval = checkpoint_interval
        self._every = checkpoint_every
        self._stop_requested = stop_requested
        self._lease_lost = lease_lost
        self._unsaved: int | None = None  # resume's offset not yet written
        self._max_checkpoint = max_checkpoint
        self._stealable = stealable
        self._asked = False  # the last checkpoint said: give work away
        kept = _resumed(checkpoint_state)
        self.state: dict[str, Any] = (
            json.loads(json.dumps(kept[1])) if kept is not None and kept[1] is not None else {}
        )
        """Kept with every checkpoint ``resume`` writes: what the child has built up so far
        (e.g. ``ctx.state["total"]``). JSON values under string keys, within
        DTASK_MAX_CHECKPOINT with the offset; a resumed attempt starts with the state
        committed with the offset it resumes from."""

    @functools.cached_property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger named after the template (``dtask.template.<name>``) whose every line
        names its template, run and child: ``ctx.log.info("row %s done", i)``. Made when
        first used: most short children never log."""
        return _ChildLog(
            logging.getLogger(f"dtask.template.{self.template or 'unknown'}"),
            {"template": self.template, "run": self.run_id, "child": self.index},
            self._echo,
        )

    @property
    def max_checkpoint(self) -> int | None:
        return self._max_checkpoint

    def output(self, text: str) -> None:
        """What the child prints, as ``print`` would: kept with its attempt (`dtask logs`) and
        written to the worker's log, at most DTASK_MAX_CHILD_LOG characters of it an attempt."""
        if self._output is None:
            sys.stdout.write(text)
        else:
            self._output(text)

    @property
    def checkpoint_state(self) -> Any:
        return self._state

    def checkpoint(self, state: Any) -> None:
        """Commit ``state`` (JSON). Raises LeaseLost if another worker has taken this child
        (or may have: its lease ran out while this worker could not renew it), and
        ChildStopped (after committing) if the child is asked to stop."""
        if self._lease_lost():
            raise LeaseLost(f"run {self.run_id} child {self.index} was taken over elsewhere")
        self._check(state)
        self._asked = bool(self._writer(state))
        self._state = state
        self._unsaved = None
        if self._stop_requested():
            raise ChildStopped(f"run {self.run_id} child {self.index} stopped at a checkpoint")

    def _check(self, state: Any) -> None:
        what = f"run {self.run_id} child {self.index}'s checkpoint"
        try:
            size = json_bytes(state)
        except (TypeError, ValueError) as exc:
            raise InvalidCheckpoint(f"{what} is not JSON: {exc}") from None
        problem = json_problem(state)
        if problem is not None:
            raise InvalidCheckpoint(f"{what} holds {problem}, which PostgreSQL cannot store")
        if self._max_checkpoint is not None and size > self._max_checkpoint:
            raise InvalidCheckpoint(
                f"{what} is {size:,} bytes of JSON, over the limit of {self._max_checkpoint:,}"
                " (DTASK_MAX_CHECKPOINT): keep progress small (an offset, a cursor, a total)"
            )

    @property
    def unsaved_checkpoint(self) -> Any:
        """Progress that ``resume`` made since its last write (committed with the finish)."""
        if self._unsaved is None:
            return None
        progress = self._progress(self._unsaved)
        self._check(progress)
        return progress

    def _progress(self, done: int) -> dict[str, Any]:
        """What ``resume`` commits: its offset, with a copy of ``state`` when there is one (a
        checkpoint without state keeps the format of the code before ``state``)."""
        if not self.state:
            return {"done": done}
        bad = [key for key in self.state if not isinstance(key, str)]
        if bad:
            raise InvalidCheckpoint(
                f"run {self.run_id} child {self.index}'s ctx.state has keys that are not"
                f" strings ({bad[0]!r}): JSON would bring them back as text"
            )
        try:
            state = json.loads(json.dumps(self.state, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidCheckpoint(
                f"run {self.run_id} child {self.index}'s ctx.state is not JSON: {exc}"
            ) from None
        problem = json_problem(state)
        if problem is not None:
            raise InvalidCheckpoint(
                f"run {self.run_id} child {self.index}'s ctx.state holds {problem}, which"
                " PostgreSQL cannot store"
            )
        return {"done": done, "state": state}

    def should_stop(self) -> bool:
        """True when this worker must let go of the child: asked to hand it over, or it was
        taken over by another worker (then the next checkpoint raises LeaseLost)."""
        return self._lease_lost() or self._stop_requested()

    def resume(
        self,
        items: Iterable[T],
        *,
        checkpoint_every: int | None = None,
        checkpoint_interval: float | None = None,
    ) -> Iterator[T]:
        """Yield ``items``, skipping those an earlier attempt completed; checkpoint as it goes.

        The iterable must yield the same items in the same order on every attempt.
        """
        for step, value in self.steps(items, checkpoint_every, checkpoint_interval):
            if step is Step.ITEM:
                yield value
            elif step is Step.WRITE:
                self.checkpoint(value)  # raises ChildStopped when asked to stop
            else:
                self.cut_at(value)

    def steps(
        self, items: Iterable[T], every: int | None, interval: float | None
    ) -> Iterator[tuple[Step, Any]]:
        """``resume`` as steps its driver takes (the sync one here, the async one in
        dtask/domain/async_context.py): an item to hand out, a checkpoint to write (a WRITE
        asked because the child must stop is followed by nothing: it raises), or a cut of
        the range at ``done`` after a checkpoint at which the dispatcher asked for work."""
        done = self._resume_offset()
        every = every or self._every
        interval = self._interval if interval is None else interval
        remaining: Iterable[Any] = (
            items[done:] if isinstance(items, range) else islice(items, done, None)
        )
        since_write = 0
        last_write = time.monotonic()
        cuts = self._cuts(items)
        for item in remaining:
            if cuts is not None and item > cuts.b:  # the rest was given away
                break
            if self._lease_lost():
                raise LeaseLost(f"run {self.run_id} child {self.index} was taken over elsewhere")
            if self._stop_requested():
                yield Step.WRITE, self._progress(done)  # commits, then raises ChildStopped
            yield Step.ITEM, item
            done += 1
            since_write += 1
            self._unsaved = done
            if since_write >= every or time.monotonic() - last_write >= interval:
                yield Step.WRITE, self._progress(done)
                since_write = 0
                last_write = time.monotonic()
                if self._asked and cuts is not None:
                    yield Step.CUT, done

    def cut_at(self, done: int) -> None:
        """A step's CUT: give the second half of what is not done away (a write)."""
        if self._stealable is not None:
            self._cut(self._stealable, done)

    def _cuts(self, items: Iterable[Any]) -> Stealable | None:
        """The child's range, where ``items`` is exactly it (``range(a, b + 1)``): only then
        does an item's position say which number it is, and may the rest be cut."""
        s = self._stealable
        if s is None or not isinstance(items, range) or items.step != 1:
            return None
        return s if (items.start, items.stop) == (s.a, s.b + 1) else None

    def give_away(self, done: int | None) -> int | None:
        """For a child that walks its range itself (``resume`` does this for its caller):
        after a ``checkpoint`` at which the dispatcher asked for work, give the second half
        of what is not done (``done`` numbers from the range's start) to a new child. The
        last number this child still owns (its range's end, moved earlier by a cut); None
        for a child whose range cannot be cut. ``done`` None: nothing is given away."""
        s = self._stealable
        if s is None:
            return None
        if self._asked and done is not None:
            self._cut(s, done)
        return s.b

    def _cut(self, stealable: Stealable, done: int) -> None:
        self._asked = False
        at = cut(stealable.a, stealable.b, done)
        if at is not None and stealable.give(at):
            self.log.info("gave %s..%s away to a new child", at, stealable.b)
            stealable.b = at - 1

    def _resume_offset(self) -> int:
        kept = _resumed(self._state)
        if kept is not None:
            return kept[0]
        raise ValueError(
            f"checkpoint {self._state!r} was not written by resume(); use checkpoint_state directly"
        )


def _resumed(checkpoint: Any) -> tuple[int, dict[str, Any] | None] | None:
    """A checkpoint ``resume`` wrote: its offset and state (``{"done": k}`` before ``state``
    existed, ``{"done": k, "state": {...}}`` since); (0, None) for none; None for another."""
    if checkpoint is None:
        return 0, None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("done"), int):
        return None
    state = checkpoint.get("state")
    return int(checkpoint["done"]), state if isinstance(state, dict) else None
