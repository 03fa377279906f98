"""Resource tiers as broker queues. A run's children wait in the queue of its tier (the run's
queue itself for basic work, ``<queue>.regular`` and ``<queue>.premium`` above), and a worker
of a tier consumes its own tier's queues first, then those of the tiers below: work runs
only on workers of its tier or a higher one, and an idle higher worker takes lower work."""

from __future__ import annotations

from collections.abc import Sequence

from dtask.domain.clients import Tier

DEFAULT_QUEUE = "dtask"


def tier_queue(queue: str | None, tier: Tier) -> str | None:
    """The broker queue for work of ``tier`` submitted to ``queue`` (None: the default)."""
    if tier is Tier.BASIC:
        return queue
    return f"{queue or DEFAULT_QUEUE}.{tier.value}"


def served_queues(queues: Sequence[str], tier: Tier) -> list[str]:
    """The queues a worker of ``tier`` consumes for ``queues``, in the order it takes from
    them: every queue's own tier first, then each tier below."""
    below = [t for t in reversed(Tier) if t.rank <= tier.rank]
    return [tier_queue(q, t) or q for t in below for q in queues]


def base_queue(name: str) -> str:
    """The queue a run was submitted to, from its tier's broker queue (``tier_queue``'s
    inverse)."""
    base, _, suffix = name.rpartition(".")
    return base if base and suffix in (Tier.REGULAR, Tier.PREMIUM) else name
