"""What a child printed, kept bounded (dtask/worker/output.py)."""

from __future__ import annotations

import io

import pytest
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
    printed = "".join(f"line {i}\n" for i in range(100)) + "partial"
    assert through.getvalue() == printed[:100]  # the worker's log: the first ones
    assert tail.unlogged() == len(printed) - 100
    kept, skipped = tail.kept()
    assert kept == printed[-100:]  # `dtask logs`: the last ones
    assert skipped == len(printed) - 100 == tail.written - 100


@given(st.lists(st.text(max_size=3000), max_size=50), st.integers(min_value=0, max_value=5000))
def test_the_log_gets_the_first_characters_and_a_count_of_the_rest(
    chunks: list[str], limit: int
) -> None:
    through = io.StringIO()
    tail = Tail(limit)
    out = tail.stream(through)
    for chunk in chunks:
        out.write(chunk)
    printed = "".join(chunks)
    assert through.getvalue() == printed[:limit]
    assert tail.unlogged() == len(printed) - len(printed[:limit])


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


def test_a_child_s_stream_answers_as_a_text_stream_and_closing_it_keeps_the_worker_s() -> None:
    """What code in a child may ask of its stdout, as of the io.TextIOBase it was."""
    through = io.StringIO()
    tail = Tail(1000)
    out = tail.stream(through)
    out.writelines(["a\n", "b\n"])
    with out as f:
        f.write("c\n")
    out.close()
    assert not through.closed and not out.closed
    out.write("d\n")
    assert tail.text() == through.getvalue() == "a\nb\nc\nd\n"
    assert isinstance(out, io.TextIOBase)
    assert (out.writable(), out.readable(), out.seekable(), out.isatty()) == (
        True, False, False, False,
    )  # fmt: skip
    with pytest.raises(io.UnsupportedOperation):
        out.fileno()
