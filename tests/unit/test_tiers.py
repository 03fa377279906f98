"""Resource tiers: which queue work of a tier waits in, which queues a worker of a tier takes
from and in which order, and the tier a client's run gets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtask.cli.services import tiered
from dtask.domain.clients import Client, Tier
from dtask.domain.tiers import DEFAULT_QUEUE, base_queue, served_queues, tier_queue
from dtask.exceptions import DtaskError

tiers = st.sampled_from(list(Tier))
names = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


@given(work=tiers, worker=tiers, queues=st.lists(names, min_size=1, max_size=3, unique=True))
def test_work_reaches_a_worker_exactly_when_its_tier_is_not_higher(
    work: Tier, worker: Tier, queues: list[str]
) -> None:
    served = served_queues(queues, worker)
    for queue in queues:
        assert (tier_queue(queue, work) in served) == (work.rank <= worker.rank)


@given(worker=tiers, queues=st.lists(names, min_size=1, max_size=3, unique=True))
def test_a_worker_takes_its_own_tier_first_then_each_tier_below(
    worker: Tier, queues: list[str]
) -> None:
    served = served_queues(queues, worker)
    ranks = [next(t for t in Tier if tier_queue(base_queue(q), t) == q).rank for q in served]
    assert ranks == sorted(ranks, reverse=True) and ranks[0] == worker.rank
    assert len(served) == len(set(served)) == len(queues) * (worker.rank + 1)


@given(queue=names, tier=tiers)
def test_the_submitted_queue_is_recovered_from_the_tier_queue(queue: str, tier: Tier) -> None:
    assert base_queue(tier_queue(queue, tier) or DEFAULT_QUEUE) == queue


def test_basic_work_keeps_the_queue_it_was_given() -> None:
    assert tier_queue(None, Tier.BASIC) is None
    assert tier_queue(None, Tier.PREMIUM) == "dtask.premium"
    assert tier_queue("reports", Tier.REGULAR) == "reports.regular"


@given(client=st.none() | tiers, asked=st.none() | tiers)
def test_a_client_tier_is_the_default_and_the_ceiling(
    client: Tier | None, asked: Tier | None
) -> None:
    got = Client("c", tier=client).tier_for(asked)
    if client is not None:
        assert got.rank <= client.rank
    if asked is None:
        assert got == (client or Tier.BASIC)
    elif client is None or asked.rank <= client.rank:
        assert got == asked


@pytest.mark.parametrize(
    ("argv", "tier", "rest"),
    [
        (["-c", "2"], Tier.BASIC, ["-c", "2"]),
        (["--tier", "premium"], Tier.PREMIUM, ["--queues", "dtask.premium,dtask.regular,dtask"]),
        (["--tier=regular", "-Q", "a,b"], Tier.REGULAR, ["--queues", "a.regular,b.regular,a,b"]),
        (["-Qa", "-c", "1", "--tier", "basic"], Tier.BASIC, ["-c", "1", "--queues", "a"]),
        (["--queues=x", "--tier", "regular"], Tier.REGULAR, ["--queues", "x.regular,x"]),
    ],
)
def test_dtask_worker_tier_becomes_the_queues_it_consumes(
    argv: list[str], tier: Tier, rest: list[str]
) -> None:
    assert tiered(argv) == (tier, rest)


def test_an_unknown_worker_tier_is_one_clear_error() -> None:
    with pytest.raises(DtaskError, match="tier must be one of basic, regular, premium, got 'gold'"):
        tiered(["--tier", "gold"])
