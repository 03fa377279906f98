"""`dtask schedule backfill NAME --from T --to T [--max-running N]`: one run per slot of a
range, in slot order, with its progress."""

from __future__ import annotations

import argparse
import json
import sys
import time

from dtask.cli.base import EXIT_OK, moment

PLAIN_EVERY = 5.0  # seconds between two progress lines without a terminal


def backfill(args: argparse.Namespace) -> int:
    from dtask.client.schedules import Backfilled, backfill_schedule, get_schedule

    tz = get_schedule(args.name).timing.tz
    tty = sys.stderr.isatty()
    said = [time.monotonic()]

    def progress(done: Backfilled) -> None:
        line = (
            f"backfill of {done.schedule}: {done.done:,}/{done.slots:,} slots"
            f" ({done.created:,} new runs, {done.existing:,} already had theirs)"
        )
        if tty:
            sys.stderr.write("\r\x1b[2K" + line)
        elif time.monotonic() - said[0] >= PLAIN_EVERY and done.done < done.slots:
            sys.stderr.write(line + "\n")
            said[0] = time.monotonic()
        sys.stderr.flush()

    done = backfill_schedule(
        args.name,
        moment(args.start, tz),
        moment(args.end, tz),
        max_running=args.max_running,
        on_progress=progress,
    )
    if tty:
        sys.stderr.write("\n")
    if args.json:
        print(json.dumps(done.as_json()))
    else:
        print(
            f"schedule {done.schedule}: {done.slots:,} slots from {args.start} to {args.end},"
            f" {done.created:,} new runs, {done.existing:,} already had theirs"
        )
    return EXIT_OK
