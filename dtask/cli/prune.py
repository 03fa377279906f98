"""`dtask prune`: delete finished runs older than DTASK_RETENTION (or --older-than) with their
children, in small transactions, while workers go on; the reaper does it on its own."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dtask.cli.base import EXIT_OK, bounded
from dtask.exceptions import ConfigurationError

days = bounded(float, 0.0, 36_500.0, "a number of days")


def register(sub: Any) -> None:
    prune = sub.add_parser(
        "prune", help="delete finished runs (and their children) older than DTASK_RETENTION days"
    )
    prune.set_defaults(handler=_cmd_prune)
    prune.add_argument(
        "--older-than", type=days, metavar="DAYS", help="instead of DTASK_RETENTION (default 30)"
    )
    prune.add_argument("--dry-run", action="store_true", help="say what would go, delete nothing")
    prune.add_argument("--json", action="store_true")


def _cmd_prune(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.db.retention import Pruned

    older = args.older_than
    if older is None:
        older = services.current().settings.retention
        if not older:
            raise ConfigurationError(
                "DTASK_RETENTION is 0 (runs are kept for ever): say how old with --older-than DAYS"
            )
    store = services.store().retention
    age = older * 86400
    if args.dry_run:
        found = store.count(age)
        verb = "would be deleted"
    else:
        show = sys.stderr.isatty() and not args.json

        def progress(done: Pruned) -> None:
            if show:
                print(f"\r{done.runs:,} runs, {done.children:,} children deleted", end="",
                      file=sys.stderr, flush=True)  # fmt: skip

        found = store.prune(age, progress=progress)
        if show:
            print(file=sys.stderr)
        verb = "deleted"
    if args.json:
        print(json.dumps({"runs": found.runs, "children": found.children, "older_than_days": older,
                          "dry_run": args.dry_run}))  # fmt: skip
    else:
        print(f"{found.runs:,} run(s) and {found.children:,} child(ren) finished over {older:g}"
              f" day(s) ago {verb}")  # fmt: skip
    return EXIT_OK
