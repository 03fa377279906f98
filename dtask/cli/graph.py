"""`dtask graph RUN`: the runs a run waits for (upstream) and those waiting for it
(downstream), as two trees in the terminal."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtask.cli.base import EXIT_OK, run_id
from dtask.domain.deps import draw


def register(sub: Any) -> None:
    graph = sub.add_parser(
        "graph", help="show the runs a run waits for and the runs that wait for it, as trees"
    )
    graph.set_defaults(handler=_cmd_graph, reads_only=True)
    graph.add_argument("run_id", type=run_id)
    graph.add_argument("--json", action="store_true", help="every run and edge as one object")


def _cmd_graph(args: argparse.Namespace) -> int:
    from dtask import services

    graph = services.store().runs.graph(args.run_id)
    if args.json:
        print(json.dumps(graph.as_json()))
        return EXIT_OK
    root = graph.nodes[graph.root]
    print(f"run {root.id} {root.template} ({root.state})")
    for side, edges in (
        ("after (upstream)", graph.upstream),
        ("before (downstream)", graph.downstream),
    ):
        lines = draw(graph.root, edges, graph.nodes)
        print(f"{side}:")
        print("\n".join(lines) if lines else "    none")
    return EXIT_OK
