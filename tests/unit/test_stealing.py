"""Straggler stealing's rule (dtask/domain/stealing.py), with hypothesis: random ranges,
progress, steal sequences and crashes keep the pieces disjoint and covering, and every number
is done by exactly one piece in the end."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from dtask.domain.dispatch import BATCH_SECONDS, batch_size
from dtask.domain.stealing import MIN_PIECE, MIN_SECONDS_LEFT, Running, cut, pick


@dataclass
class Piece:
    """A child as the store holds it: its range, its committed checkpoint, and what its
    current attempt has done past that (lost if it dies)."""

    a: int
    b: int
    checkpoint: int = 0
    ahead: int = 0
    cuts: int = 0

    @property
    def done(self) -> int:
        return self.checkpoint + self.ahead

    @property
    def size(self) -> int:
        return self.b - self.a + 1


def covered(pieces: list[Piece], lo: int, hi: int) -> None:
    ranges = sorted((p.a, p.b) for p in pieces)
    expected = lo
    for a, b in ranges:
        assert a == expected and b >= a, ranges
        expected = b + 1
    assert expected == hi + 1, ranges


steps = st.lists(
    st.tuples(st.sampled_from(["work", "checkpoint", "steal", "crash", "crash_mid_steal"]),
              st.integers(0, 50), st.integers(1, 40)),
    max_size=60,
)  # fmt: skip


@settings(max_examples=400)
@given(lo=st.integers(-1000, 1000), size=st.integers(1, 2000), script=steps)
def test_steals_and_crashes_keep_every_number_on_exactly_one_piece(
    lo: int, size: int, script: list[tuple[str, int, int]]
) -> None:
    hi = lo + size - 1
    pieces = [Piece(lo, hi)]
    for action, which, amount in script:
        piece = pieces[which % len(pieces)]
        if action == "work":
            piece.ahead = min(piece.size - piece.checkpoint, piece.ahead + amount)
        elif action == "checkpoint":
            piece.checkpoint, piece.ahead = piece.done, 0
        elif action == "crash":  # the attempt dies: its work past the checkpoint is redone
            piece.ahead = 0
        elif action in ("steal", "crash_mid_steal"):
            # a steal is asked and answered at a checkpoint: the shrink and the new child
            # commit together, under the child's fence, or neither does (a crash before)
            piece.checkpoint, piece.ahead = piece.done, 0
            at = cut(piece.a, piece.b, piece.checkpoint)
            if at is not None and action == "steal":
                assert piece.a + piece.checkpoint < at <= piece.b
                pieces.append(Piece(at, piece.b, cuts=piece.cuts + 1))
                piece.b, piece.cuts = at - 1, piece.cuts + 1
                assert piece.checkpoint <= piece.size  # its checkpoint still fits its range
                assert min(piece.size - piece.checkpoint, pieces[-1].size) >= MIN_PIECE
        covered(pieces, lo, hi)
    done = sorted(n for p in pieces for n in range(p.a, p.a + p.done))
    assert len(done) == len(set(done))  # nothing done by two pieces
    for piece in pieces:  # every piece finishes what it holds
        piece.ahead = piece.size - piece.checkpoint
    assert sorted(n for p in pieces for n in range(p.a, p.a + p.done)) == list(range(lo, hi + 1))


@given(a=st.integers(-100, 100), size=st.integers(1, 500), done=st.integers(0, 500))
def test_the_giver_keeps_the_larger_half_of_what_it_has_not_done(
    a: int, size: int, done: int
) -> None:
    b = a + size - 1
    done = min(done, size)
    at = cut(a, b, done)
    left = size - done
    if left < 2 * MIN_PIECE:
        assert at is None
    else:
        assert at is not None
        kept, given = at - (a + done), b - at + 1
        assert kept + given == left and 0 <= kept - given <= 1 and given >= MIN_PIECE


def test_the_child_with_the_most_time_left_is_picked_once_measured_and_worth_it() -> None:
    fast = Running(1, 0, 1, 1000, done=500, seconds=5)  # 5 s left
    slow = Running(1, 1, 1001, 2000, done=100, seconds=10)  # 90 s left
    fresh = Running(1, 2, 2001, 3000, done=0, seconds=30)  # no rate yet
    nearly = Running(2, 0, 1, 100, done=99, seconds=99)  # 1 s left, and 1 number
    worn = Running(2, 1, 1, 100_000, done=1, seconds=10, cuts=8)
    assert pick([fast, slow, fresh, nearly, worn]) == slow
    assert pick([fast, fresh, nearly, worn]) == fast
    assert pick([fresh, nearly, worn]) is None
    assert pick([Running(3, 0, 1, 10, done=1, seconds=MIN_SECONDS_LEFT)]) is not None


def test_a_child_short_enough_to_share_a_message_is_never_cut() -> None:
    """The dispatcher puts children shorter than BATCH_SECONDS several to a message; such a
    child's whole life is below the rule's floor."""
    assert MIN_SECONDS_LEFT > BATCH_SECONDS
    assert batch_size(MIN_SECONDS_LEFT) == 1
    short = Running(1, 0, 1, 10_000, done=9_000, seconds=BATCH_SECONDS * 0.9)
    assert pick([short]) is None
