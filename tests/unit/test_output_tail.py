"""What a child printed, kept bounded (dtask/worker/output.py)."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from dtask.worker.output import Tail


def test_it_writes_through_and_keeps_the_last_characters() -> None:
    through = io.StringIO()
    tail = Tail(100)
    out = tail.stream(through)
    for i in range(100):
        print(f"line {i}", file=out)
    out.write("partial")
    assert through.getvalue().endswith("line 99\npartial")
    kept, skipped = tail.kept()
    assert kept is not None and kept.endswith("line 99\npartial") and len(kept) == 100
    assert skipped == len(through.getvalue()) - 100 == tail.written - 100


@given(st.lists(st.text(max_size=3000), max_size=50), st.integers(min_value=0, max_value=5000))
def test_what_it_keeps_is_bounded_and_the_suffix_of_what_was_printed(
    chunks: list[str], limit: int
) -> None:
    tail = Tail(limit)
    for chunk in chunks:
        tail.add(chunk)
    printed = "".join(chunks)
    kept, skipped = tail.kept()
    assert (kept or "") == (printed[-limit:] if limit else "")
    assert skipped + len(kept or "") == len(printed) == tail.written


def test_nothing_printed_is_none() -> None:
    assert Tail(10).kept() == (None, 0)
    assert Tail(0).text() is None
