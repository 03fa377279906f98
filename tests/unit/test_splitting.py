from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.params import Param
from dtask.domain.splitting import RangeSplit, check_ranges
from dtask.domain.templates import Template
from dtask.exceptions import InvalidSplit, InvalidVariables


@given(
    start=st.integers(-10_000, 10_000),
    length=st.integers(1, 20_000),
    chunk=st.integers(1, 5_000),
)
def test_range_split_is_disjoint_and_covering(start: int, length: int, chunk: int) -> None:
    end = start + length - 1
    split = RangeSplit("s", "e", chunk=chunk)
    specs = split({"s": start, "e": end})
    covered = [i for spec in specs for i in range(spec["a"], spec["b"] + 1)]
    assert covered == list(range(start, end + 1))
    assert len(specs) == split.count({"s": start, "e": end})
    assert all(spec["b"] - spec["a"] + 1 <= chunk for spec in specs)


@given(length=st.integers(1, 10_000), parts=st.integers(1, 200))
def test_range_split_by_parts(length: int, parts: int) -> None:
    split = RangeSplit("s", "e", parts=parts)
    specs = split({"s": 1, "e": length})
    assert len(specs) == min(parts, length) == split.count({"s": 1, "e": length})
    check_ranges(specs, 1, length, "a", "b")


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([(1, 5), (5, 10)], "overlaps"),
        ([(1, 4), (6, 10)], "5..5 are not covered"),
        ([(1, 9)], "10..10 are not covered"),
        ([(2, 10)], "1..1 are not covered"),
        ([(1, 10), (11, 10)], "is empty"),
    ],
)
def test_check_ranges_finds_overlaps_and_gaps(ranges: list[tuple[int, int]], message: str) -> None:
    with pytest.raises(InvalidSplit, match=message):
        check_ranges([{"a": a, "b": b} for a, b in ranges], 1, 10, "a", "b")


def test_range_split_carries_other_keys() -> None:
    split = RangeSplit("s", "e", chunk=5, carry=("tag",))
    assert split({"s": 1, "e": 7, "tag": "x"}) == [
        {"a": 1, "b": 5, "tag": "x"},
        {"a": 6, "b": 7, "tag": "x"},
    ]


@pytest.mark.parametrize(
    ("rendered", "error", "message"),
    [
        ({"s": 1}, InvalidSplit, "no key 'e'"),
        ({"s": 1, "e": "9"}, InvalidVariables, "must be an integer"),
        ({"s": 5, "e": 4}, InvalidVariables, "empty"),
        ([1, 2], InvalidSplit, "dict"),
    ],
)
def test_range_split_bad_input(rendered: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        RangeSplit("s", "e")(rendered)


def test_range_split_options_are_checked() -> None:
    with pytest.raises(InvalidSplit, match="chunk"):
        RangeSplit("s", "e", chunk=0)
    with pytest.raises(InvalidSplit, match="parts"):
        RangeSplit("s", "e", parts=0)


@given(
    length=st.integers(1, 10_000),
    slots=st.integers(0, 300),
    each=st.integers(1, 8),
    most=st.integers(1, 500),
)
def test_a_split_by_live_slots_makes_k_children_a_slot_within_its_bounds(
    length: int, slots: int, each: int, most: int
) -> None:
    """``parts="slots*K"``: K children a live slot, at least 1, at most DTASK_MAX_CHILDREN
    (and the range's size); still disjoint and covering."""
    split = RangeSplit("s", "e", parts="slots" if each == 1 else f"slots*{each}")
    assert split.per_slot == each
    assert split.count({"s": 1, "e": length}) is None  # not known before the split
    sized = split.for_slots(slots, most)
    specs = sized({"s": 1, "e": length})
    check_ranges(specs, 1, length, "a", "b")
    assert len(specs) == min(max(1, slots) * each, most, length)
    sizes = {spec["b"] - spec["a"] + 1 for spec in specs}
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("parts", ["slot", "slots*0", "slots*x", "slots*2*2", "cores", True, -1])
def test_a_bad_parts_is_one_line(parts: object) -> None:
    with pytest.raises(InvalidSplit, match="parts"):
        RangeSplit("s", "e", parts=parts)  # type: ignore[arg-type]


def test_a_template_split_by_slots_asks_them_once_at_its_split() -> None:
    asked: list[int] = []

    def slots() -> int:
        asked.append(3)
        return 3

    template = Template(
        name="by_slots",
        params={"n": Param(int)},
        skeleton={"lo": 1, "hi": "${n}"},
        split=RangeSplit("lo", "hi", parts="slots*2"),
        function=lambda ctx, a, b: None,
    )
    assert template.count({"n": 100}, 1000) == ({"lo": 1, "hi": 100}, None)
    specs = template.plan({"n": 100}, 1000, slots=slots)
    assert (len(specs), asked) == (6, [3])
    assert len(template.plan({"n": 100}, 1000)) == 2  # no reader (eager): one slot's worth
