"""Split strategies: a rendered skeleton -> disjoint child specs (each child's kwargs). Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from dtask.exceptions import InvalidSplit, InvalidVariables, TooManyChildren

ChildSpec = dict[str, Any]
SpecText = str  # a child's spec as compact JSON text: what is stored, a tenth of a dict's memory


@runtime_checkable
class SplitStrategy(Protocol):
    """Any callable from the rendered skeleton to a list (or any iterable) of child kwargs.

    A strategy may also define ``count(rendered) -> int`` so that submit can reject an
    oversized split before anything is written.
    """

    def __call__(self, rendered: Any) -> Iterable[Mapping[str, Any]]: ...


def check_count(count: int, max_children: int) -> None:
    if count > max_children:
        raise TooManyChildren(
            f"the split would create {count:,} children, more than the maximum {max_children:,}"
            " (use a larger chunk, or raise DTASK_MAX_CHILDREN)"
        )


def check_specs(
    specs: Iterable[Mapping[str, Any]], max_children: int, max_spec: int = 65_536
) -> list[SpecText]:
    """Specs as compact JSON text, or a clear error (too many, empty, not JSON, too big). Any
    iterable is taken, consumed lazily: a generator that would yield ten million specs is
    stopped at ``max_children + 1``. Text, not dicts: a million children's specs as dicts
    took 520 MB in the process that splits them."""
    if isinstance(specs, str | bytes | Mapping) or not isinstance(specs, Iterable):
        raise InvalidSplit(
            "a split must return a list (or another iterable, e.g. a generator) of dicts,"
            f" got {type(specs).__name__}"
        )
    try:
        return _checked(iter(specs), max_children, max_spec)
    finally:
        close = getattr(specs, "close", None)
        if callable(close):  # a generator stopped early runs its cleanup now, not at GC
            close()


def _checked(specs: Iterator[Any], max_children: int, max_spec: int) -> list[SpecText]:
    checked: list[SpecText] = []
    for index, spec in enumerate(specs):
        if index == max_children:
            raise TooManyChildren(
                f"the split yields more than the maximum {max_children:,} children (stopped"
                " there; use a larger chunk, or raise DTASK_MAX_CHILDREN)"
            )
        if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
            raise InvalidSplit(
                f"child spec #{index} must be a dict with str keys, got {spec!r:.200}"
            )
        try:
            text = json.dumps(
                dict(spec), separators=(",", ":"), ensure_ascii=False, allow_nan=False
            )
        except (TypeError, ValueError) as exc:
            raise InvalidSplit(f"child spec #{index} is not JSON: {exc}") from None
        size = len(text.encode())
        if size > max_spec:
            raise InvalidSplit(
                f"child spec #{index} is {size:,} bytes of JSON, over the limit of"
                f" {max_spec:,} (DTASK_MAX_CHILD_SPEC): pass a reference (a path, a key), not data"
            )
        checked.append(text)
    if not checked:
        raise InvalidSplit("the split produced no children: there is nothing to run")
    return checked


def check_ranges(specs: Sequence[Mapping[str, Any]], start: int, end: int, a: str, b: str) -> None:
    """Raise unless the ``[a, b]`` ranges are disjoint and cover ``[start, end]`` exactly."""
    ranges = sorted((int(s[a]), int(s[b])) for s in specs)
    expected_next = start
    for lo, hi in ranges:
        if lo > hi:
            raise InvalidSplit(f"range [{lo}, {hi}] is empty")
        if lo < expected_next:
            raise InvalidSplit(f"range [{lo}, {hi}] overlaps the previous one")
        if lo > expected_next:
            raise InvalidSplit(f"numbers {expected_next}..{lo - 1} are not covered by any child")
        expected_next = hi + 1
    if expected_next != end + 1:
        raise InvalidSplit(f"numbers {expected_next}..{end} are not covered by any child")


SLOTS = "slots"


def per_slot(parts: str) -> int:
    """``"slots"`` -> 1, ``"slots*4"`` -> 4; anything else is refused in one line."""
    word, _, times = parts.replace(" ", "").partition("*")
    if word == SLOTS and (not times or (times.isdigit() and 1 <= int(times) <= 1024)):
        return int(times) if times else 1
    raise InvalidSplit(
        f'RangeSplit parts must be a number, "slots" or "slots*K" (K 1..1024), got {parts!r}'
    )


@dataclass(frozen=True)
class RangeSplit:
    """Split the inclusive range ``[rendered[start], rendered[end]]`` into chunks ``[a, b]``.

    ``chunk`` is the size of each child's range; ``parts`` (if given) instead asks for that
    many children of near-equal size: a number, or ``"slots"`` (``"slots*4"``: four per slot)
    for as many as the live worker slots of the run's queue when the master splits (see
    ``for_slots``). ``carry`` names skeleton keys copied into every spec.
    """

    start: str
    end: str
    chunk: int = 1000
    parts: int | str | None = None
    a: str = "a"
    b: str = "b"
    carry: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise InvalidSplit(f"RangeSplit chunk must be >= 1, got {self.chunk}")
        if isinstance(self.parts, str):
            per_slot(self.parts)
        elif self.parts is not None and (isinstance(self.parts, bool) or self.parts < 1):
            raise InvalidSplit(f"RangeSplit parts must be >= 1, got {self.parts!r}")

    @property
    def per_slot(self) -> int | None:
        """Children per live slot (``parts="slots*K"``), None for a fixed split."""
        return per_slot(self.parts) if isinstance(self.parts, str) else None

    def for_slots(self, slots: int, max_children: int) -> RangeSplit:
        """This split with its number of children fixed from ``slots`` live slots: ``K`` per
        slot (no slot seen counts as one: its children wait for a worker as any run's do),
        never above ``max_children`` or the range's size."""
        wanted = max(1, slots) * (self.per_slot or 1)
        return replace(self, parts=max(1, min(wanted, max_children)))

    def bounds(self, rendered: Any) -> tuple[int, int]:
        if not isinstance(rendered, Mapping):
            raise InvalidSplit("RangeSplit needs a skeleton that is a dict")
        values = []
        for key in (self.start, self.end):
            if key not in rendered:
                raise InvalidSplit(f"RangeSplit: the skeleton has no key {key!r}")
            value = rendered[key]
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidVariables(f"range {key} must be an integer, got {value!r}")
            values.append(value)
        lo, hi = values
        if hi < lo:
            raise InvalidVariables(
                f"the range {self.start}={lo} .. {self.end}={hi} is empty"
                f" ({self.end} must be >= {self.start})"
            )
        return lo, hi

    def _parts(self) -> int | None:
        if isinstance(self.parts, str):
            raise InvalidSplit(f"RangeSplit parts={self.parts!r} is decided by for_slots()")
        return self.parts

    def count(self, rendered: Any) -> int | None:
        """How many children, None where the live slots decide (checked all the same)."""
        lo, hi = self.bounds(rendered)
        if isinstance(self.parts, str):
            return None
        parts = self._parts()
        total = hi - lo + 1
        return -(-total // self.chunk) if parts is None else min(parts, total)

    def __call__(self, rendered: Any) -> list[ChildSpec]:
        lo, hi = self.bounds(rendered)
        specs = list(self.iterate(rendered))
        check_ranges(specs, lo, hi, self.a, self.b)
        return specs

    def iterate(self, rendered: Any) -> Iterator[ChildSpec]:
        """The specs one at a time (what a template's plan consumes: disjoint and covering by
        construction, which the property tests check through ``__call__``)."""
        lo, hi = self.bounds(rendered)
        parts = self._parts()
        missing = [k for k in self.carry if k not in rendered]
        if missing:
            raise InvalidSplit(f"RangeSplit: the skeleton has no key {missing[0]!r} to carry")
        extra = {k: rendered[k] for k in self.carry}
        if parts is None:
            for a in range(lo, hi + 1, self.chunk):
                yield {self.a: a, self.b: min(a + self.chunk - 1, hi), **extra}
            return
        # exactly min(parts, size) children, their sizes one apart at most
        count = min(parts, hi - lo + 1)
        width, longer = divmod(hi - lo + 1, count)
        a = lo
        for index in range(count):
            b = a + width - (0 if index < longer else 1)
            yield {self.a: a, self.b: b, **extra}
            a = b + 1
