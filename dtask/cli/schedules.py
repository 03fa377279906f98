"""`dtask schedule add|list|show|pause|resume|rm|backfill`: the schedules `dtask beat`
triggers."""

from __future__ import annotations

import argparse
import json
from typing import Any

from dtask.cli.base import EXIT_OK, Parser, add_vars, moment, number, parse_vars
from dtask.domain.schedules import CATCH_UP_WINDOW, GRACE, iso
from dtask.exceptions import InvalidDelayTolerance


def register(sub: Any) -> None:
    from dtask.domain.schedules import Misfire, Overlap

    schedule = sub.add_parser("schedule", help="manage the schedules `dtask beat` triggers")
    schedule.set_defaults(handler=_cmd_schedule)
    ops = schedule.add_subparsers(dest="op", required=True, parser_class=Parser)
    add = ops.add_parser("add", help="add a schedule: a template, its variables and when")
    add.add_argument("name")
    add.add_argument("template")
    add_vars(add, "a variable of its runs (repeatable)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5 fields, or 6 with seconds first")
    when.add_argument("--every", type=int, metavar="SECONDS", help="an interval in seconds")
    add.add_argument("--tz", default="UTC", help="IANA time zone of the cron (default UTC)")
    add.add_argument("--misfire", choices=[p.value for p in Misfire], default=Misfire.SKIP.value)
    add.add_argument("--overlap", choices=[p.value for p in Overlap], default=Overlap.ALLOW.value)
    add.add_argument(
        "--grace", type=float, default=GRACE, help="seconds late before a slot counts as missed"
    )
    add.add_argument(
        "--catch-up-window", type=float, default=CATCH_UP_WINDOW, metavar="SECONDS",
        help="with --misfire catch_up: how far back missed slots still run",
    )  # fmt: skip
    add.add_argument("--start", metavar="ISO", help="no slot before this time (in --tz)")
    add.add_argument("--end", metavar="ISO", help="no slot after this time (in --tz)")
    add.add_argument(
        "--delay-tolerance", metavar="SECONDS",
        help="how late after its slot a run's first child may start (default: the template's)",
    )  # fmt: skip
    add.add_argument(
        "--on-late", choices=["run", "fail"], help="a late run still runs or fails (default:"
        " the template's)",
    )  # fmt: skip
    add.add_argument(
        "--after-schedule",
        metavar="NAME",
        help="each slot's run waits for NAME's run of the same (or latest earlier) slot",
    )
    add.add_argument("--replace", action="store_true", help="update a schedule of that name")
    add.add_argument("--json", action="store_true")
    listed = ops.add_parser("list", help="list the schedules")
    listed.set_defaults(reads_only=True)
    listed.add_argument("--json", action="store_true")
    backfill = ops.add_parser(
        "backfill", help="run a schedule for each of its slots in a range (once per slot)"
    )
    backfill.add_argument("name")
    backfill.add_argument(
        "--from", dest="start", required=True, metavar="ISO", help="the first slot (its --tz)"
    )
    backfill.add_argument(
        "--to", dest="end", required=True, metavar="ISO", help="the last slot, included"
    )
    backfill.add_argument(
        "--max-running", type=int, metavar="N", help="at most N of its runs unfinished at once"
    )
    backfill.add_argument("--json", action="store_true")
    for name, text in (
        ("show", "show a schedule, its next slots and its latest runs"),
        ("pause", "stop triggering a schedule"),
        ("resume", "trigger a paused schedule again, from now on"),
        ("rm", "remove a schedule (its runs stay)"),
    ):
        op = ops.add_parser(name, help=text)
        op.add_argument("name")
        if name == "show":
            op.set_defaults(reads_only=True)
            op.add_argument("--json", action="store_true")


def _cmd_schedule(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from dtask import templating
    from dtask.client import schedules as scheduling

    templating.load_templates()
    if args.op == "add":
        from dtask.domain.templates import registry

        tpl = registry.get(args.template)
        schedule = scheduling.add_schedule(
            args.name,
            tpl.name,
            tpl.parse_variables(parse_vars(args.var)),
            cron=args.cron,
            every=args.every,
            tz=args.tz,
            misfire=args.misfire,
            overlap=args.overlap,
            grace=args.grace,
            catch_up_window=args.catch_up_window,
            start=moment(args.start, args.tz),
            end=moment(args.end, args.tz),
            delay_tolerance=number(
                args.delay_tolerance, float, "--delay-tolerance", InvalidDelayTolerance
            ),
            on_late=args.on_late,
            replace=args.replace,
            after_schedule=args.after_schedule,
        )
    elif args.op == "list":
        schedules = scheduling.list_schedules()
        now = datetime.now(UTC)
        if args.json:
            print(json.dumps([s.as_json(now) for s in schedules]))
            return EXIT_OK
        print(f"{'NAME':<20} {'TEMPLATE':<16} {'STATE':<8} {'NEXT SLOT':<21} WHEN")
        for s in schedules:
            row = s.as_json(now)
            state = "enabled" if s.enabled else "paused"
            upcoming = row["next_slots"][0] if row["next_slots"] else "-"
            print(f"{s.name:<20} {s.template:<16} {state:<8} {upcoming:<21} {s.timing.describe()}")
        return EXIT_OK
    elif args.op == "backfill":
        from dtask.cli.backfill import backfill

        return backfill(args)
    elif args.op == "pause":
        schedule = scheduling.pause_schedule(args.name)
    elif args.op == "resume":
        schedule = scheduling.resume_schedule(args.name)
    elif args.op == "rm":
        scheduling.remove_schedule(args.name)
        print(f"schedule {args.name} removed (its runs stay)")
        return EXIT_OK
    else:
        schedule = scheduling.get_schedule(args.name)
    _print_schedule(schedule, getattr(args, "json", False))
    return EXIT_OK


def _print_schedule(schedule: Any, as_json: bool) -> None:
    from datetime import UTC, datetime

    from dtask import services
    from dtask.domain.cron import Cron
    from dtask.domain.schedules import zone

    row = schedule.as_json(datetime.now(UTC))
    if as_json:
        print(json.dumps(row))
        return
    timing = schedule.timing
    state = "enabled" if row["enabled"] else "paused"
    print(f"schedule {schedule.name}  {schedule.template}  {state}")
    print(f"  when       {timing.describe()}")
    if isinstance(timing.trigger, Cron) and (meaning := timing.trigger.explain()):
        print(f"  meaning    {meaning}")
    print(f"  variables  {json.dumps(schedule.variables)}")
    misfire = f"{timing.misfire.value} (a slot over {timing.grace:g} s late was missed"
    if row["misfire"] == "catch_up":
        misfire += f"; catch up at most {timing.catch_up_window:g} s back"
    print(f"  misfire    {misfire})")
    print(f"  overlap    {timing.overlap.value}")
    if schedule.after_schedule:
        print(f"  after      schedule {schedule.after_schedule} (its run of the same slot)")
    for label, key in (("start", "start"), ("end", "end"), ("buffered", "buffered")):
        if row[key]:
            print(f"  {label:<10} {row[key]}")
    local = zone(timing.tz)
    upcoming = [
        iso(slot) + ("" if timing.tz == "UTC" else f" ({slot.astimezone(local):%a %H:%M:%S %Z})")
        for slot in (timing.upcoming(datetime.now(UTC), 3) if schedule.enabled else [])
    ]
    print(f"  next       {', '.join(upcoming) or '-'}")
    if schedule.last_error:
        print(f"  last error {schedule.last_error}")
    runs = services.store().runs.statuses(limit=5, schedule=schedule.name)
    for status in runs:
        slot = iso(status.slot) if status.slot else "?"
        print(f"  run {status.id:<6} slot {slot}  {status.state.value}")
