from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.splitting import RangeSplit, check_ranges
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
    assert len(specs) <= parts
    assert len(specs) == split.count({"s": 1, "e": length})
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
