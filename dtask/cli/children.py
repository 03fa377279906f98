"""`dtask children RUN`: a run's children (range, state, attempts, worker, progress, time,
error); `dtask status RUN --child N` shows one with its traceback (``show_child``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dtask.cli.base import EXIT_BAD_INPUT, EXIT_OK, limit, run_id
from dtask.domain.runs import ChildState

PAGE = 1000


def register(sub: Any) -> None:
    children = sub.add_parser(
        "children", help="list a run's children: range, state, attempts, worker, error"
    )
    children.set_defaults(handler=_cmd_children, reads_only=True)
    children.add_argument("run_id", type=run_id)
    children.add_argument("--state", choices=[s.value for s in ChildState], help="only these")
    children.add_argument(
        "--limit", type=limit, default=100, help="at most this many (default 100)"
    )
    children.add_argument("--json", action="store_true", help="one JSON array of the children")


def _cmd_children(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.client.runs import get_run

    get_run(args.run_id)  # RunNotFound, in one line
    state = None if args.state is None else ChildState(args.state)
    store, shown, after = services.store(), 0, None
    while shown < args.limit:
        page = store.children.page(args.run_id, state, min(PAGE, args.limit - shown), after)
        if not page:
            break
        for child in page:  # a JSON array streamed a page at a time, as the lines are
            if args.json:
                print(("[" if not shown else ",") + json.dumps(child.as_json()))
            else:
                print(_line(child))
            shown += 1
        after = page[-1].index
    if args.json:
        print("]" if shown else "[]")
    elif not shown:
        print(f"run {args.run_id} has no {args.state or ''} children".replace("  ", " "))
    return EXIT_OK


def _line(child: Any) -> str:
    took = ""
    if child.started_at and child.finished_at:
        took = f" {(child.finished_at - child.started_at).total_seconds():.1f}s"
    done = (child.checkpoint or {}).get("done") if isinstance(child.checkpoint, dict) else None
    progress = f" done {done}" if done is not None else ""
    worker = f" on {child.worker}" if child.worker else ""
    error = f"  {child.error.splitlines()[0]}" if child.error else ""
    return (
        f"{child.index:>6}  {child.state.value:<9} attempt {child.attempt}/{child.max_attempts}"
        f"  {json.dumps(child.spec)}{progress}{worker}{took}{error}"
    )


def show_child(run_id: int, index: int, as_json: bool) -> int:
    from dtask import services
    from dtask.client.runs import get_run

    get_run(run_id)
    child = services.store().children.detail(run_id, index)
    if child is None:
        print(f"dtask: error: run {run_id} has no child {index}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if as_json:
        print(json.dumps(child.as_json()))
        return EXIT_OK
    print(f"run {run_id} child {index}  {child.state.value}")
    print(f"  spec       {json.dumps(child.spec)}")
    print(f"  attempts   {child.attempt} of {child.max_attempts}")
    if child.checkpoint is not None:
        print(f"  checkpoint {json.dumps(child.checkpoint)}")
    if child.worker:
        print(f"  worker     {child.worker}")
    if child.error:
        print(f"  error      {child.error}")
    if child.result is not None:
        print(f"  result     {json.dumps(child.result)}")
    if child.output:
        whose = "its success" if child.state.value == "succeeded" else "its latest failed attempt"
        print(f"  the last lines {whose} printed:")
        for line in child.output.splitlines():
            print(f"    {line}")
    if child.traceback:
        print("  traceback of its latest failed attempt:")
        for line in child.traceback.rstrip().splitlines():
            print(f"    {line}")
    return EXIT_OK
