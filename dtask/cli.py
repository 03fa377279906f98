"""The ``dtask`` command. Exit codes: 0 ok, 1 the run failed, 2 bad input or unreachable service,
3 a wait timed out. Errors are one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from dtask.exceptions import DtaskError, InvalidVariables
from dtask.runs import RunState, RunStatus
from dtask.schedules import iso

EXIT_OK, EXIT_RUN_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, like every other bad input
        self.exit(EXIT_BAD_INPUT, f"dtask: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dtask", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    submit = sub.add_parser("submit", help="trigger a master run of a template")
    submit.add_argument("template")
    submit.add_argument("-v", "--var", action="append", default=[], metavar="NAME=VALUE")
    submit.add_argument("--key", help="trigger key: a second submit with it returns the same run")
    submit.add_argument("--wait", action="store_true", help="wait until the run has finished")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after SECONDS")
    submit.add_argument("--json", action="store_true", help="print the run as one JSON object")

    status = sub.add_parser("status", help="show a run's state and its children's progress")
    status.add_argument("run_id", type=int)
    status.add_argument("--json", action="store_true")
    status.add_argument("--watch", action="store_true", help="follow the run until it finishes")
    status.add_argument("--timeout", type=float, help="with --watch: give up after SECONDS")

    for name, text in (
        ("cancel", "cancel a run: pending children never start, running ones stop at a checkpoint"),
        ("rerun", "run a failed or cancelled run's unfinished and failed children again"),
    ):
        op = sub.add_parser(name, help=text)
        op.add_argument("run_id", type=int)
        op.add_argument("--json", action="store_true")

    runs = sub.add_parser("runs", help="list recent runs")
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--limit", type=int, default=50)

    templates = sub.add_parser("templates", help="list the registered templates")
    templates.add_argument("--json", action="store_true")

    up = sub.add_parser("up", help="run a local stack: services, workers, beat and Flower")
    up.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    up.add_argument("--concurrency", type=int, default=1, help="pool processes per worker")
    up.add_argument("--no-flower", action="store_true")
    up.add_argument("--no-beat", action="store_true")
    up.add_argument("--flower-port", type=int, default=5555)

    flower = sub.add_parser("flower", help="run Flower for dtask's workers and tasks")
    flower.add_argument("--port", type=int, default=5555)
    flower.add_argument("--address", default="127.0.0.1")

    sub.add_parser("beat", help="run Celery beat on dtask's schedules (any number may run)")
    _schedule_parser(sub)
    drain = sub.add_parser(
        "drain", help="stop a worker gracefully: its running children are handed over at once"
    )
    drain.add_argument("worker", help="the worker's name, e.g. worker-1@host (see Flower)")
    sub.add_parser("migrate", help="bring the database schema up to date")
    sub.add_parser("down", help="stop the embedded PostgreSQL and Redis")
    sub.add_parser(
        "worker",
        help="run a Celery worker with dtask's settings (extra options go to celery worker)",
        add_help=False,
    )
    return parser


def _schedule_parser(sub: Any) -> None:
    from dtask.schedules import Misfire, Overlap

    schedule = sub.add_parser("schedule", help="manage the schedules `dtask beat` triggers")
    ops = schedule.add_subparsers(dest="op", required=True, parser_class=_Parser)
    add = ops.add_parser("add", help="add a schedule: a template, its variables and when")
    add.add_argument("name")
    add.add_argument("template")
    add.add_argument("-v", "--var", action="append", default=[], metavar="NAME=VALUE")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="5 fields, or 6 with seconds first")
    when.add_argument("--every", type=int, metavar="SECONDS", help="an interval in seconds")
    add.add_argument("--tz", default="UTC", help="IANA time zone of the cron (default UTC)")
    add.add_argument("--misfire", choices=[p.value for p in Misfire], default=Misfire.SKIP.value)
    add.add_argument("--overlap", choices=[p.value for p in Overlap], default=Overlap.ALLOW.value)
    add.add_argument(
        "--grace", type=float, default=10.0, help="seconds late before a slot counts as missed"
    )
    add.add_argument(
        "--catch-up-window", type=float, default=86400.0, metavar="SECONDS",
        help="with --misfire catch_up: how far back missed slots still run",
    )  # fmt: skip
    add.add_argument("--start", metavar="ISO", help="no slot before this time (in --tz)")
    add.add_argument("--end", metavar="ISO", help="no slot after this time (in --tz)")
    add.add_argument("--replace", action="store_true", help="update a schedule of that name")
    add.add_argument("--json", action="store_true")
    ops.add_parser("list", help="list the schedules").add_argument("--json", action="store_true")
    for name, text in (
        ("show", "show a schedule, its next slots and its latest runs"),
        ("pause", "stop triggering a schedule"),
        ("resume", "trigger a paused schedule again, from now on"),
        ("rm", "remove a schedule (its runs stay)"),
    ):
        op = ops.add_parser(name, help=text)
        op.add_argument("name")
        if name == "show":
            op.add_argument("--json", action="store_true")


def _parse_vars(pairs: Sequence[str]) -> dict[str, str]:
    parsed: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidVariables(f"-v expects NAME=VALUE, got {pair!r}")
        if name in parsed:
            raise InvalidVariables(f"variable {name!r} is given twice")
        parsed[name] = value
    return parsed


def _print_status(status: RunStatus, as_json: bool) -> None:
    if as_json:
        print(json.dumps(status.as_json()))
        return
    c = status.children
    print(f"run {status.id}  {status.template}  {status.state.value}")
    print(f"  key        {status.key}")
    print(f"  variables  {json.dumps(status.variables)}")
    print(
        f"  children   {c.total} total, {c.succeeded} succeeded, {c.failed} failed,"
        f" {c.running} running, {c.pending} pending"
    )
    if status.schedule:
        slot = iso(status.slot) if status.slot else "?"
        print(f"  schedule   {status.schedule}, slot {slot}")
    print(f"  created    {status.created_at:%Y-%m-%d %H:%M:%S %Z}")
    if status.finished_at:
        print(f"  finished   {status.finished_at:%Y-%m-%d %H:%M:%S %Z}")
    if status.error:
        print(f"  error      {status.error}")


def _outcome(status: RunStatus) -> int:
    return EXIT_RUN_FAILED if status.state in (RunState.FAILED, RunState.CANCELLED) else EXIT_OK


def _wait(run_id: int, timeout: float | None, show: bool) -> RunStatus:
    from dtask.client import Run
    from dtask.progress import Progress

    return Run(run_id).wait(timeout, on_progress=Progress() if show else None)


def _cmd_submit(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.client import submit
    from dtask.templates import registry

    services.load_templates()
    tpl = registry.get(args.template)
    variables = tpl.parse_variables(_parse_vars(args.var))
    run = submit(tpl.name, variables, key=args.key)
    if not args.json:
        verb = "submitted" if run.created else "already exists for this key"
        print(f"run {run.id} {verb}", file=sys.stderr if args.wait else sys.stdout)
    if args.wait:
        status = _wait(run.id, args.timeout, show=sys.stderr.isatty() or not args.json)
        _print_status(status, args.json)
        return _outcome(status)
    if args.json:
        _print_status(run.status(), True)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    from dtask.client import get_run

    run = get_run(args.run_id)
    status = _wait(run.id, args.timeout, show=True) if args.watch else run.status()
    _print_status(status, args.json)
    return _outcome(status) if args.watch else EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    from dtask.client import get_run

    _print_status(get_run(args.run_id).cancel(), args.json)
    return EXIT_OK


def _cmd_rerun(args: argparse.Namespace) -> int:
    from dtask.client import get_run

    _print_status(get_run(args.run_id).rerun(), args.json)
    return EXIT_OK


def _cmd_runs(args: argparse.Namespace) -> int:
    from dtask import services

    statuses = services.store().statuses(args.limit)
    if args.json:
        print(json.dumps([s.as_json() for s in statuses]))
        return EXIT_OK
    print(f"{'ID':>6}  {'TEMPLATE':<20} {'STATE':<10} {'DONE':>13}  {'CREATED':<19}  KEY")
    for s in statuses:
        done = f"{s.children.finished}/{s.children.total}"
        print(
            f"{s.id:>6}  {s.template:<20} {s.state.value:<10} {done:>13}"
            f"  {s.created_at:%Y-%m-%d %H:%M:%S}  {s.key}"
        )
    return EXIT_OK


def _cmd_templates(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.templates import registry

    services.load_templates()
    rows = [
        {
            "name": t.name,
            "params": {n: p.type_name for n, p in t.params.items()},
            "skeleton": t.skeleton,
            "max_attempts": t.options.max_attempts,
            "queue": t.options.queue,
            "module": t.function.__module__,
        }
        for t in registry.all()
    ]
    if args.json:
        print(json.dumps(rows))
        return EXIT_OK
    for row in rows:
        params = ", ".join(f"{n}: {t}" for n, t in row["params"].items())
        print(f"{row['name']}({params})  skeleton={json.dumps(row['skeleton'])}  [{row['module']}]")
    return EXIT_OK


def _cmd_migrate(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.db import engine_for, schema

    engine = engine_for(services.database_url())
    schema.upgrade(engine)
    print(f"database at revision {schema.current_revision(engine)}")
    return EXIT_OK


def _cmd_down(args: argparse.Namespace) -> int:
    from dtask import embedded
    from dtask.settings import load

    home = load().home
    stopped = embedded.stop(home)
    print(f"stopped {', '.join(stopped)} in {home}" if stopped else f"nothing running in {home}")
    return EXIT_OK


def _cmd_up(args: argparse.Namespace) -> int:
    import signal
    import threading

    from dtask.stack import Stack

    stack = Stack(
        workers=args.workers,
        concurrency=args.concurrency,
        flower=not args.no_flower,
        beat=not args.no_beat,
        flower_port=args.flower_port,
    )
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        stack.start()
        stack.wait_ready()
        print("dtask is up:")
        for line in stack.describe():
            print(f"  {line}")
        print("Ctrl-C stops everything.", flush=True)
        reported: set[str] = set()
        while not stopping.wait(1):
            for child in stack.unexpected_exits():
                if child.name not in reported:
                    reported.add(child.name)
                    print(
                        f"dtask up: {child.name} exited ({child.proc.returncode}); see {child.log}"
                    )
    finally:
        print("dtask up: stopping...", flush=True)
        stack.stop()
        print("dtask up: stopped", flush=True)
    return EXIT_OK


def _cmd_flower(args: argparse.Namespace) -> int:
    from dtask.stack import flower_auth
    from dtask.worker import configure

    auth = flower_auth(args.address)
    app = configure()
    if auth:
        os.environ["FLOWER_BASIC_AUTH"] = auth  # not on the command line, where ps shows it
    else:  # flower_auth allows no password on loopback only
        os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"
    app.start(["flower", f"--port={args.port}", f"--address={args.address}"])
    return EXIT_OK


def _cmd_drain(args: argparse.Namespace) -> int:
    from dtask.exceptions import DtaskError
    from dtask.worker import configure

    app = configure()
    if not app.control.ping(destination=[args.worker], timeout=2):
        raise DtaskError(f"no worker {args.worker!r} answered (names are listed in Flower)")
    from dtask.worker.drain import DRAIN_COMMAND

    app.control.broadcast(DRAIN_COMMAND, destination=[args.worker])
    print(f"worker {args.worker} is handing over its running children and stopping")
    return EXIT_OK


def _cmd_beat(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.worker import configure

    app = configure()
    services.store()  # fail now, in one line, if PostgreSQL is unreachable
    app.start(["beat", "--scheduler=dtask.worker.beat:DatabaseScheduler", "--loglevel=INFO"])
    return EXIT_OK


def _cmd_schedule(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from dtask import scheduling, services

    services.load_templates()
    if args.op == "add":
        from dtask.templates import registry

        tpl = registry.get(args.template)
        schedule = scheduling.add_schedule(
            args.name,
            tpl.name,
            tpl.parse_variables(_parse_vars(args.var)),
            cron=args.cron,
            every=args.every,
            tz=args.tz,
            misfire=args.misfire,
            overlap=args.overlap,
            grace=args.grace,
            catch_up_window=args.catch_up_window,
            start=_moment(args.start, args.tz),
            end=_moment(args.end, args.tz),
            replace=args.replace,
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


def _moment(text: str | None, tz: str) -> Any:
    from datetime import datetime

    from dtask.exceptions import InvalidSchedule
    from dtask.schedules import zone

    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidSchedule(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-01T09:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=zone(tz))


def _print_schedule(schedule: Any, as_json: bool) -> None:
    from datetime import UTC, datetime

    from dtask import services
    from dtask.schedules import zone

    row = schedule.as_json(datetime.now(UTC))
    if as_json:
        print(json.dumps(row))
        return
    timing = schedule.timing
    state = "enabled" if row["enabled"] else "paused"
    print(f"schedule {schedule.name}  {schedule.template}  {state}")
    print(f"  when       {timing.describe()}")
    print(f"  variables  {json.dumps(schedule.variables)}")
    misfire = f"{timing.misfire.value} (a slot over {timing.grace:g} s late was missed"
    if row["misfire"] == "catch_up":
        misfire += f"; catch up at most {timing.catch_up_window:g} s back"
    print(f"  misfire    {misfire})")
    print(f"  overlap    {timing.overlap.value}")
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
    runs = services.store().statuses(limit=5, schedule=schedule.name)
    for status in runs:
        slot = iso(status.slot) if status.slot else "?"
        print(f"  run {status.id:<6} slot {slot}  {status.state.value}")


def worker_argv(extra: Sequence[str]) -> list[str]:
    argv = ["worker", *extra]
    if not any(a in ("-n", "--hostname") or a.startswith("--hostname=") for a in extra):
        argv += ["--hostname", f"dtask-{os.getpid()}@%h"]
    if not any(a in ("-l", "--loglevel") or a.startswith("--loglevel=") for a in extra):
        argv += ["--loglevel", "INFO"]
    return argv


def _cmd_worker(extra: Sequence[str]) -> int:
    from dtask.worker import configure, drain, reaper

    app = configure()
    reaper.install()
    drain.install()
    app.worker_main(worker_argv(extra))
    return EXIT_OK


COMMANDS = {
    "submit": _cmd_submit,
    "status": _cmd_status,
    "cancel": _cmd_cancel,
    "rerun": _cmd_rerun,
    "runs": _cmd_runs,
    "templates": _cmd_templates,
    "migrate": _cmd_migrate,
    "up": _cmd_up,
    "flower": _cmd_flower,
    "beat": _cmd_beat,
    "schedule": _cmd_schedule,
    "drain": _cmd_drain,
    "down": _cmd_down,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["worker"]:
            return _cmd_worker(argv[1:])
        args = _parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except DtaskError as exc:
        print(f"dtask: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("dtask: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
