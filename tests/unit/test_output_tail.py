from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from dtask.worker.output import KEPT, LINES, WIDTH, Tail


def test_it_writes_through_and_keeps_the_last_lines() -> None:
    through = io.StringIO()
    tail = Tail(through)
    for i in range(100):
        print(f"line {i}", file=tail)
    tail.write("partial")
    assert through.getvalue().endswith("line 99\npartial")
    kept = (tail.text() or "").splitlines()
    assert kept[-1] == "partial" and kept[-2] == "line 99" and len(kept) == LINES


@given(st.lists(st.text(max_size=2000), max_size=50))
def test_what_it_keeps_is_bounded_and_a_suffix_of_what_was_printed(chunks: list[str]) -> None:
    tail = Tail(io.StringIO())
    for chunk in chunks:
        tail.write(chunk)
    kept = tail.text()
    if kept is None:
        return
    assert len(kept) <= KEPT
    lines = kept.split("\n")
    assert len(lines) <= LINES and all(len(line) <= WIDTH for line in lines)
    printed = "".join(chunks).split("\n")
    assert lines[-1] == printed[-1][:WIDTH] or printed[-1] == ""


def test_nothing_printed_is_none() -> None:
    assert Tail(io.StringIO()).text() is None
