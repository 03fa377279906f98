"""How the dispatcher cuts a run's next children into messages (``dispatch.messages``): in
order, none left out, ``batch`` at most to a message, none past MESSAGE_BYTES by its specs
unless alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.dispatch import CHILD_FRAME, MESSAGE_BYTES, MESSAGE_FRAME, messages

ROOM = MESSAGE_BYTES - MESSAGE_FRAME


@given(
    st.lists(st.integers(0, 3 * MESSAGE_BYTES // 2), max_size=60)
    | st.lists(st.integers(0, 200), max_size=1000),
    st.integers(1, 400),
)
def test_every_child_goes_once_in_order_within_both_bounds(sizes: list[int], batch: int) -> None:
    counts = messages(sizes, batch)
    assert sum(counts) == len(sizes) and all(c > 0 for c in counts)
    at = 0
    for count in counts:
        part = sizes[at : at + count]
        assert count <= batch
        assert count == 1 or sum(part) + CHILD_FRAME * count <= ROOM
        after = sizes[at + count : at + count + 1]
        if after and count < batch:  # cut for its bytes: the next would not have fit
            assert sum(part) + after[0] + CHILD_FRAME * (count + 1) > ROOM
        at += count


def test_small_specs_go_batch_to_a_message() -> None:
    assert messages([20] * 1000, 400) == [400, 400, 200]
    assert messages([], 400) == []
    assert messages([MESSAGE_BYTES] * 3, 400) == [1, 1, 1]
