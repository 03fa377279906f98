"""`dtask submit|status|cancel|rerun|runs|templates`: triggering and watching runs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from dtask.cli.base import (
    EXIT_NOT_YET,
    EXIT_OK,
    EXIT_RUN_FAILED,
    add_vars,
    child_index,
    interrupted,
    limit,
    number,
    parse_vars,
    run_id,
    timeout,
)
from dtask.cli.waiting import warn_if_nobody_consumes
from dtask.domain.clients import Tier
from dtask.domain.runs import RunState, RunStatus
from dtask.domain.schedules import iso
from dtask.domain.waiting import waiting_json
from dtask.exceptions import (
    InvalidClient,
    InvalidConcurrency,
    InvalidDelayTolerance,
    InvalidExecutionCap,
    InvalidVariables,
)


def register(sub: Any) -> None:
    submit = sub.add_parser("submit", help="trigger a master run of a template")
    submit.set_defaults(handler=_cmd_submit)
    submit.add_argument("template")
    add_vars(submit, "a variable of the run (repeatable)")
    submit.add_argument(
        "--key",
        help="trigger key: a second submit with it (same --client) returns the same run",
    )
    submit.add_argument(
        "--execution-cap",
        metavar="SECONDS",
        help="stop (and retry) a child's attempt that runs longer; overrides the template's",
    )
    submit.add_argument(
        "--client", default="default", help="the client the run is charged to (default: default)"
    )
    submit.add_argument(
        "--priority", metavar="P", help="0 (lowest) to 9 (highest), default 5; capped by client"
    )
    submit.add_argument(
        "--delay-tolerance",
        metavar="SECONDS",
        help="how late its first child may start; past that the run is marked late",
    )
    submit.add_argument(
        "--on-late", choices=["run", "fail"], help="a late run still runs (default) or fails"
    )
    submit.add_argument(
        "--tier",
        choices=[t.value for t in Tier],
        help="resource tier its children need (default: the template's, else the client's)",
    )
    submit.add_argument(
        "--notify-url", metavar="URL", help="POSTed the run's JSON when it finishes (signed)"
    )
    submit.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="runs of this key (placeholders: ${name}) beyond --max-concurrent wait their turn;"
        " default the template's",
    )
    submit.add_argument(
        "--max-concurrent",
        metavar="N",
        help="unfinished runs of the client per concurrency key (default 1, or the template's)",
    )
    submit.add_argument(
        "--after",
        type=run_id,
        action="append",
        default=[],
        metavar="RUN_ID",
        help="wait for this run to succeed first (repeatable); fail if it fails",
    )
    submit.add_argument(
        "--after-key",
        action="append",
        default=[],
        metavar="KEY",
        help="wait for the run this trigger key of --client started (repeatable)",
    )
    submit.add_argument(
        "--from",
        dest="source",
        metavar="FILE.jsonl",
        help="one run per line (`-`: stdin): its variables as a JSON object, or"
        ' {"variables": {...}, "key": "..."}; --var values are every line\'s defaults',
    )
    submit.add_argument("--wait", action="store_true", help="wait until the run has finished")
    submit.add_argument(
        "--timeout",
        type=timeout,
        help="with --wait: give up after SECONDS (default: wait for ever)",
    )
    submit.add_argument("--json", action="store_true", help="print the run as one JSON object")
    submit.add_argument(
        "-q", "--quiet", action="store_true", help="print only the run's id (for --after $(...))"
    )

    status = sub.add_parser("status", help="show a run's state and its children's progress")
    status.set_defaults(handler=_cmd_status, reads_only=True)
    status.add_argument("run_id", type=run_id)
    status.add_argument("--json", action="store_true")
    status.add_argument("--watch", action="store_true", help="follow the run until it finishes")
    status.add_argument(
        "--timeout",
        type=timeout,
        help="with --watch: give up after SECONDS (default: watch for ever)",
    )
    status.add_argument(
        "--child", type=child_index, metavar="N", help="show child N: its spec, error and traceback"
    )

    result = sub.add_parser(
        "result", help="print a run's result (its template's reduce of the children's values)"
    )
    result.set_defaults(handler=_cmd_result, reads_only=True)
    result.add_argument("run_id", type=run_id)
    result.add_argument("--wait", action="store_true", help="wait until the run has finished")
    result.add_argument(
        "--timeout",
        type=timeout,
        help="with --wait: give up after SECONDS (default: wait for ever)",
    )

    for name, text, handler in (
        (
            "cancel",
            "cancel a run: pending children never start, running ones stop at a checkpoint",
            _cmd_cancel,
        ),
        (
            "rerun",
            "run a failed or cancelled run's unfinished and failed children again",
            _cmd_rerun,
        ),
    ):
        op = sub.add_parser(name, help=text)
        op.set_defaults(handler=handler)
        op.add_argument("run_id", type=run_id)
        op.add_argument("--json", action="store_true")
        if name == "cancel":
            op.add_argument(
                "--terminate",
                action="store_true",
                help="kill the pool process of a running child that has not stopped at its next"
                " step within DTASK_EXECUTION_CAP_GRACE (a hung child)",
            )

    runs = sub.add_parser("runs", help="list recent runs")
    runs.set_defaults(handler=_cmd_runs, reads_only=True)
    runs.add_argument("--json", action="store_true", help="one JSON array of the runs")
    runs.add_argument("-q", "--ids", action="store_true", help="print only their ids, one a line")
    runs.add_argument("--limit", type=limit, default=50)
    runs.add_argument("--client", help="only the runs of this client")
    runs.add_argument("--state", choices=[s.value for s in RunState], help="only runs in it")
    runs.add_argument("--template", help="only the runs of this template")
    runs.add_argument("--schedule", help="only the runs of this schedule's slots")

    templates = sub.add_parser("templates", help="list the registered templates")
    templates.set_defaults(handler=_cmd_templates)
    templates.add_argument("--json", action="store_true")


def _print_status(status: RunStatus, as_json: bool) -> None:
    from dtask.cli.waiting import why

    waiting = None if status.finished else why(status.id)
    if as_json:
        print(json.dumps({**status.as_json(), **waiting_json(waiting)}))
        return
    c = status.children
    print(f"run {status.id}  {status.template}  {status.state.value}")
    if waiting is not None:
        print(f"  why        {waiting.text}")
    print(f"  key        {status.key}")
    print(f"  client     {status.client}, priority {status.priority}, tier {status.tier.value}")
    if status.start_after:
        print(f"  starts     {status.start_after:%Y-%m-%d %H:%M:%S %Z} (not before)")
    if status.deadline:
        verdict = {None: "", True: " (late)", False: " (started in time)"}[status.late]
        print(f"  deadline   {status.deadline:%Y-%m-%d %H:%M:%S %Z}{verdict}")
    print(f"  variables  {json.dumps(status.variables)}")
    print(
        f"  children   {c.total} total, {c.succeeded} succeeded, {c.failed} failed,"
        f" {c.running} running, {c.pending} pending"
    )
    if status.slots is not None:
        print(f"  split      by capacity: {status.slots} live slots seen")
    if status.after:
        unfinished = f" (waiting for {_runs(status.waiting_for)})" if status.waiting_for else ""
        print(f"  after      {_runs(status.after)}{unfinished}")
    if status.concurrency_key:
        print(f"  key limit  {status.concurrency_key!r}, max_concurrent {status.max_concurrent}")
    if status.schedule:
        slot = iso(status.slot) if status.slot else "?"
        print(f"  schedule   {status.schedule}, slot {slot}")
    print(f"  created    {status.created_at:%Y-%m-%d %H:%M:%S %Z}")
    if status.finished_at:
        print(f"  finished   {status.finished_at:%Y-%m-%d %H:%M:%S %Z}")
    if status.error:
        print(f"  error      {status.error}")
    if status.result is not None:
        shown = json.dumps(status.result)
        print(f"  result     {shown if len(shown) <= 200 else shown[:197] + '...'}")


def _runs(ids: tuple[int, ...], shown: int = 10) -> str:
    listed = ", ".join(map(str, ids[:shown]))
    more = f" and {len(ids) - shown:,} more" if len(ids) > shown else ""
    return f"run{'s' if len(ids) > 1 else ''} {listed}{more}"


def _outcome(status: RunStatus) -> int:
    return EXIT_RUN_FAILED if status.state in (RunState.FAILED, RunState.CANCELLED) else EXIT_OK


def _wait(run_id: int, timeout: float | None, show: bool) -> RunStatus:
    from dtask.cli.waiting import Reasons
    from dtask.client.runs import Run
    from dtask.progress import Progress

    reasons, progress = Reasons(), Progress()

    def both(status: RunStatus) -> None:
        reasons(status)
        progress(status)

    try:
        return Run(run_id).wait(timeout, on_progress=both if show else None)
    except BaseException as exc:
        if interrupted(exc):
            _interrupted(run_id)
        raise


def _cmd_submit(args: argparse.Namespace) -> int:
    from dtask import templating
    from dtask.client.runs import submit
    from dtask.domain.templates import registry

    templating.load_templates()
    tpl = registry.get(args.template)
    variables = tpl.parse_variables(parse_vars(args.var))
    options = dict(
        execution_cap=number(args.execution_cap, float, "--execution-cap", InvalidExecutionCap),
        client=args.client,
        priority=number(args.priority, int, "--priority", InvalidClient),
        delay_tolerance=number(
            args.delay_tolerance, float, "--delay-tolerance", InvalidDelayTolerance
        ),
        on_late=args.on_late,
        tier=args.tier,
        notify_url=args.notify_url,
        after=[*args.after, *args.after_key] or None,
        concurrency_key=args.concurrency_key,
        max_concurrent=number(args.max_concurrent, int, "--max-concurrent", InvalidConcurrency),
    )
    if args.source is not None:
        from dtask.cli.bulk import submit_lines

        for given, flag in ((args.key, "--key"), (args.wait, "--wait")):
            if given:
                raise InvalidVariables(f"{flag} is for one run: with --from, give keys per line")
        return submit_lines(tpl.name, args.source, variables, args.json, **options)
    run = submit(tpl.name, variables, key=args.key, **options)
    if args.quiet:
        print(run.id, flush=True)
    try:
        if not args.json and not args.quiet:
            verb = "submitted" if run.created else "already exists for this key"
            status = run.status()
            if status.waiting_for:
                verb += f", waiting for {_runs(status.waiting_for)}"
            elif status.state is RunState.WAITING:
                verb += f", waiting for its turn of concurrency key {status.concurrency_key!r}"
            elif status.state is RunState.FAILED:
                verb += f", failed: {status.error}"
            print(f"run {run.id} {verb}", file=sys.stderr if args.wait else sys.stdout)
        warn_if_nobody_consumes(run.id)
        if args.wait:
            quiet = args.quiet or args.json
            status = _wait(run.id, args.timeout, show=sys.stderr.isatty() or not quiet)
            if not args.quiet:
                _print_status(status, args.json)
            return _outcome(status)
    except BaseException as exc:
        if interrupted(exc):
            _interrupted(run.id)
        raise
    if args.json and not args.quiet:
        _print_status(run.status(), True)
    return EXIT_OK


def _interrupted(run_id: int) -> NoReturn:
    """Ctrl-C while a run goes on: say how to get back to it."""
    print(
        f"\ndtask: stopped waiting; run {run_id} goes on: `dtask status {run_id} --watch`"
        f" follows it, `dtask cancel {run_id}` stops it",
        file=sys.stderr,
    )
    raise SystemExit(130)


def _cmd_status(args: argparse.Namespace) -> int:
    from dtask.client.runs import get_run

    if args.child is not None:
        from dtask.cli.children import show_child

        return show_child(args.run_id, args.child, args.json)
    run = get_run(args.run_id)
    status = _wait(run.id, args.timeout, show=True) if args.watch else run.status()
    _print_status(status, args.json)
    return _outcome(status)


def _cmd_result(args: argparse.Namespace) -> int:
    """The result as JSON on stdout (exit 0); a failed or cancelled run's error on stderr (exit
    1); a run not finished yet says so (exit 3, as a --wait that timed out)."""
    from dtask.client.runs import get_run

    run = get_run(args.run_id)
    status = _wait(run.id, args.timeout, show=True) if args.wait else run.status()
    if not status.finished:
        print(
            f"dtask: run {status.id} is {status.state.value}: no result yet"
            f" (dtask result {status.id} --wait)",
            file=sys.stderr,
        )
        return EXIT_NOT_YET
    if status.state is not RunState.SUCCEEDED:
        print(f"dtask: run {status.id} {status.state.value}: {status.error}", file=sys.stderr)
        return EXIT_RUN_FAILED
    print(json.dumps(status.result))
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    from dtask.client.runs import get_run

    _print_status(get_run(args.run_id).cancel(args.terminate), args.json)
    return EXIT_OK


def _cmd_rerun(args: argparse.Namespace) -> int:
    from dtask.client.runs import get_run

    _print_status(get_run(args.run_id).rerun(), args.json)
    return EXIT_OK


def _cmd_runs(args: argparse.Namespace) -> int:
    from dtask import services

    statuses = services.store().runs.statuses(
        args.limit,
        client=args.client,
        state=None if args.state is None else RunState(args.state),
        template=args.template,
        schedule=args.schedule,
    )
    if args.json:
        print(json.dumps([s.as_json() for s in statuses]))
        return EXIT_OK
    if args.ids:
        print("\n".join(str(s.id) for s in statuses))
        return EXIT_OK
    print(
        f"{'ID':>6}  {'TEMPLATE':<20} {'STATE':<10} {'OK':>7} {'FAILED':>7} {'TOTAL':>7}"
        f"  {'CREATED':<19}  KEY"
    )
    for s in statuses:
        c = s.children
        print(
            f"{s.id:>6}  {s.template:<20} {s.state.value:<10} {c.succeeded:>7} {c.failed:>7}"
            f" {c.total:>7}  {s.created_at:%Y-%m-%d %H:%M:%S}  {s.key}"
        )
    return EXIT_OK


def _cmd_templates(args: argparse.Namespace) -> int:
    from dtask import templating
    from dtask.domain.templates import registry

    templating.load_templates()
    rows = [
        {
            "name": t.name,
            "params": {n: p.type_name for n, p in t.params.items()},
            "skeleton": t.skeleton,
            "max_attempts": t.options.max_attempts,
            "queue": t.options.queue,
            "execution_cap": t.options.execution_cap,
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
