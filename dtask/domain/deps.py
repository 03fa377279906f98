"""Dependencies between runs: which state a new run starts in given its upstreams', what a
failed upstream's dependents say, and the terminal picture of a run's graph. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dtask.domain.runs import RunState
from dtask.exceptions import InvalidVariables

MAX_UPSTREAMS = 10_000  # runs one run may be submitted after
SHOWN_IN_GRAPH = 200  # runs `dtask graph` draws on each side before it says how many more


def check_after(ids: Iterable[object], where: str) -> tuple[int, ...]:
    """The upstream ids, each once, in the order first given."""
    seen: dict[int, None] = {}
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidVariables(
                f"{where}: after: {value!r} is not a run id (a positive integer; see `dtask runs`)"
            )
        seen[value] = None
    if len(seen) > MAX_UPSTREAMS:
        raise InvalidVariables(
            f"{where}: after: {len(seen):,} runs, over the limit of {MAX_UPSTREAMS:,}"
        )
    return tuple(seen)


def upstream_error(upstream: int, state: RunState) -> str:
    how = "was cancelled" if state is RunState.CANCELLED else "failed"
    return f"upstream run {upstream} {how}"


def blocking(upstreams: Mapping[int, RunState]) -> int | None:
    """The first upstream that failed or was cancelled."""
    return next(
        (u for u in sorted(upstreams) if upstreams[u] in (RunState.FAILED, RunState.CANCELLED)),
        None,
    )


def start_state(upstreams: Mapping[int, RunState]) -> tuple[RunState, str | None]:
    """A new (or rerun, never split) run's state: failed with the first upstream that failed
    or was cancelled, waiting while any is unfinished, else pending."""
    upstream = blocking(upstreams)
    if upstream is not None:
        return RunState.FAILED, upstream_error(upstream, upstreams[upstream])
    if any(not s.finished for s in upstreams.values()):
        return RunState.WAITING, None
    return RunState.PENDING, None


@dataclass(frozen=True)
class Node:
    id: int
    template: str
    state: RunState


def draw(
    root: int,
    edges: Mapping[int, Iterable[int]],
    nodes: Mapping[int, Node],
    limit: int = SHOWN_IN_GRAPH,
) -> list[str]:
    """``root``'s tree along ``edges`` (run -> the runs next to it on one side), one line per
    run; a run reached again is drawn once more without its subtree ("see above")."""
    lines: list[str] = []
    drawn: set[int] = set()
    stack: list[tuple[int, str, bool]] = [
        (child, "", i == len(kids) - 1)
        for kids in [sorted(edges.get(root, ()))]
        for i, child in reversed(list(enumerate(kids)))
    ]
    left = 0
    while stack:
        run_id, prefix, last = stack.pop()
        if len(lines) >= limit:
            left += 1
            continue
        node = nodes.get(run_id)
        label = f"run {run_id}" if node is None else f"run {run_id} {node.template} ({node.state})"
        again = run_id in drawn
        lines.append(
            f"{prefix}{'└── ' if last else '├── '}{label}{' (see above)' if again else ''}"
        )
        if again:
            continue
        drawn.add(run_id)
        kids = sorted(edges.get(run_id, ()))
        below = prefix + ("    " if last else "│   ")
        stack.extend((k, below, i == len(kids) - 1) for i, k in reversed(list(enumerate(kids))))
    if left:
        lines.append(f"... and at least {left:,} more (dtask graph --json lists every edge)")
    return lines
