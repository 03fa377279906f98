"""What a run's trace holds, decided without OpenTelemetry: which messages of children get a
span, and what a span says of them. Pure."""

from __future__ import annotations

from collections.abc import Sequence

# A run's child-message spans, about this many at most: a message whose children hold no
# multiple of the run's stride (its children / MESSAGE_SPANS) has none. A million children make
# MESSAGE_SPANS spans, not a million, whether one or a hundred go to a message.
MESSAGE_SPANS = 1000
INDICES_SHOWN = 256  # of a message's child indices, as an attribute; first, last and count always

SUBMIT, MASTER, CHILDREN, FINALIZE = (
    "dtask.submit",
    "dtask.master",
    "dtask.children",
    "dtask.finalize",
)
CHECKPOINT = "dtask.checkpoint"
SLOT = "dtask.slot"  # a schedule's slot fired (by a beat or a backfill): its run's parent


def stride(total: int | None, most: int = MESSAGE_SPANS) -> int:
    """Every ``stride``-th child's message has a span: 1 up to ``most`` children."""
    if not total or total <= most:
        return 1
    return -(-total // most)


def traced(indices: Sequence[int], total: int | None, most: int = MESSAGE_SPANS) -> bool:
    """Whether a message of ``indices`` (of a run of ``total`` children) gets a span: one of
    its children is a multiple of the run's stride (so about ``most`` messages of a run do)."""
    step = stride(total, most)
    if step == 1 or len(indices) >= step:
        return bool(indices)
    return any(i % step == 0 for i in indices)


def message_attributes(
    run_id: int, template: str, indices: Sequence[int], total: int | None
) -> dict[str, str | int | list[int]]:
    """A child message's span attributes: its run, template and children (no spec, no
    variables: they may hold what a trace must not)."""
    shown: dict[str, str | int | list[int]] = {
        "dtask.run.id": run_id,
        "dtask.template": template,
        "dtask.child.first": indices[0],
        "dtask.child.last": indices[-1],
        "dtask.child.count": len(indices),
        "dtask.child.sampled_every": stride(total),
    }
    if len(indices) <= INDICES_SHOWN:
        shown["dtask.child.indices"] = list(indices)
    return shown
