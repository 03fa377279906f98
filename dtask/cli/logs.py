"""`dtask logs RUN [--child N] [--follow]`: what a run's children printed (stdout, stderr,
``ctx.log``), the last DTASK_MAX_CHILD_LOG characters of each attempt, with the worker that
ran it and how it ended."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from dtask.cli.base import EXIT_OK, child_index, limit, run_id, timeout
from dtask.domain.logs import AttemptLog, Follower
from dtask.exceptions import ChildNotFound

FOLLOW_EVERY = 1.0  # seconds between two looks while following


def register(sub: Any) -> None:
    logs = sub.add_parser(
        "logs", help="what a run's children printed, per attempt, with the worker that ran it"
    )
    logs.set_defaults(handler=_cmd_logs, reads_only=True)
    logs.add_argument("run_id", type=run_id)
    logs.add_argument("--child", type=child_index, metavar="N", help="only this child")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="print what they print until the run ends"
    )
    logs.add_argument(
        "--timeout",
        type=timeout,
        help="with --follow: stop after SECONDS (default: follow until the run ends)",
    )
    logs.add_argument("--limit", type=limit, default=100, help="children at most, without --child")
    logs.add_argument("--json", action="store_true", help="one JSON array of the attempts")


def _cmd_logs(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.client.runs import get_run

    run = get_run(args.run_id)  # RunNotFound, in one line
    store = services.store()

    def look(since: Any) -> tuple[list[AttemptLog], Any] | None:
        if args.child is None:
            return store.logs.of_run(run.id, since, args.limit)
        return store.logs.of_child(run.id, args.child)

    found = look(None)
    if found is None:
        raise ChildNotFound(f"run {run.id} has no child {args.child} (see `dtask children`)")
    if args.json and not args.follow:
        print(json.dumps([a.as_json() for a in found[0]]))
        return EXIT_OK
    follower = Follower()
    _show(found[0], follower, args.json)
    if not args.follow:
        if not found[0]:
            print(f"run {run.id}: no output kept{'' if args.child is None else ' for that child'}")
        return EXIT_OK
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    since = found[1]
    while not run.ready():
        if deadline is not None and time.monotonic() >= deadline:
            return EXIT_OK
        time.sleep(FOLLOW_EVERY)
        found = look(since)
        if found is not None:
            _show(found[0], follower, args.json)
            since = found[1] if args.child is None else None
    last = look(since)  # what the last children printed as the run ended
    if last is not None:
        _show(last[0], follower, args.json)
    return EXIT_OK


def _show(logs: list[AttemptLog], follower: Follower, as_json: bool) -> None:
    for log in logs:
        first, text, moved = follower.new(log)
        if as_json:
            if first or text or moved:
                print(json.dumps({**log.as_json(), "output": text}), flush=True)
            continue
        if first:
            print(_header(log))
        if text:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        if moved and not first:
            print(_header(log))
        sys.stdout.flush()


def _header(log: AttemptLog) -> str:
    where = f" on {log.worker}" if log.worker else ""
    cut = f", {log.skipped:,} earlier characters not kept" if log.skipped else ""
    error = (
        f": {log.error.splitlines()[-1] if log.error.strip() else log.error}" if log.error else ""
    )
    return f"--- child {log.index}, attempt {log.attempt}{where}, {log.state}{cut}{error}"
