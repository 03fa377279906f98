"""`dtask up|down|worker|workers|beat|flower|drain|migrate|config`: processes, services and
settings."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from dtask.cli.base import EXIT_OK, port, processes
from dtask.domain.clients import Tier, tier_of
from dtask.domain.tiers import DEFAULT_QUEUE, served_queues
from dtask.exceptions import ConfigurationError


def register(sub: Any) -> None:
    up = sub.add_parser(
        "up", help="run a local stack: services, workers, beat, Flower and the HTTP API"
    )
    up.set_defaults(handler=_cmd_up)
    up.add_argument("--workers", type=processes, default=2, help="worker processes (default 2)")
    up.add_argument("--concurrency", type=processes, default=1, help="pool processes per worker")
    up.add_argument("--no-flower", action="store_true")
    up.add_argument("--no-beat", action="store_true")
    up.add_argument("--flower-port", type=port, default=5555)
    up.add_argument("--no-api", action="store_true", help="without `dtask serve`")
    up.add_argument("--api-port", type=port, default=8000)
    up.add_argument(
        "--reload",
        action="store_true",
        help="restart workers, beat and the API when a DTASK_TEMPLATES file changes",
    )
    up.add_argument(
        "--attach",
        action="store_true",
        help="follow the logs of the dtask up already running in this DTASK_HOME (one per home)",
    )

    flower = sub.add_parser("flower", help="run Flower for dtask's workers and tasks")
    flower.set_defaults(handler=_cmd_flower)
    flower.add_argument("--port", type=port, default=5555)
    flower.add_argument("--address", default="127.0.0.1")

    sub.add_parser(
        "beat", help="run Celery beat on dtask's schedules (any number may run)"
    ).set_defaults(handler=_cmd_beat)
    drain = sub.add_parser(
        "drain", help="stop a worker gracefully: its running children are handed over at once"
    )
    drain.set_defaults(handler=_cmd_drain)
    drain.add_argument("worker", help="the worker's name, e.g. worker-1@host (see Flower)")
    sub.add_parser("migrate", help="bring the database schema up to date").set_defaults(
        handler=_cmd_migrate
    )
    down = sub.add_parser("down", help="stop the embedded PostgreSQL and Redis")
    down.set_defaults(handler=_cmd_down)
    down.add_argument(
        "--force", action="store_true", help="even while workers of this stack are running"
    )
    workers = sub.add_parser("workers", help="list the live workers: queues and child slots")
    workers.set_defaults(handler=_cmd_workers, reads_only=True)
    workers.add_argument("--json", action="store_true")
    config = sub.add_parser("config", help="print the effective DTASK_* settings, secrets masked")
    config.set_defaults(handler=_cmd_config)
    config.add_argument("--json", action="store_true")
    sub.add_parser(
        "worker",
        help="run a Celery worker with dtask's settings (extra options go to celery worker)",
        add_help=False,
    )


def _cmd_migrate(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.db import Limits, engine_for, schema

    engine = engine_for(services.database_url(), limits=Limits.of(services.current().settings))
    schema.refuse_newer(engine, schema.current_revision(engine))
    schema.upgrade(engine)
    print(f"database at revision {schema.current_revision(engine)}")
    return EXIT_OK


def _cmd_down(args: argparse.Namespace) -> int:
    from dtask.local import supervisor
    from dtask.services import embedded
    from dtask.settings import load

    config = load()
    home = config.home
    up = supervisor.running(home)
    if not args.force and up is not None:
        pid = f" (pid {up['pid']})" if up.get("pid") else ""
        raise ConfigurationError(
            f"a dtask up runs in {home}{pid}: {supervisor.how_to_stop(up)}, or `dtask down --force`"
        )
    if not args.force and config.embedded_database and _embedded_postgres_alive(home):
        from dtask.client.workers import live_workers

        running = sorted(w.name for w in live_workers())
        if running:
            raise ConfigurationError(
                f"workers of the stack in {home} are running ({', '.join(running)}): stop"
                " `dtask up` first (Ctrl-C), or `dtask down --force`"
            )
    stopped = embedded.stop(home)
    print(f"stopped {', '.join(stopped)} in {home}" if stopped else f"nothing running in {home}")
    return EXIT_OK


def _embedded_postgres_alive(home: Any) -> bool:
    from dtask.exceptions import MissingExtra
    from dtask.services import embedded

    try:
        return embedded.postgres_alive(home)
    except MissingExtra:  # without dtask[local] nothing embedded can be running
        return False


def _cmd_workers(args: argparse.Namespace) -> int:
    import json

    from dtask.client.workers import live_workers

    found = live_workers()
    if args.json:
        print(json.dumps([w.as_json() for w in found]))
        return EXIT_OK
    if not found:
        print("no live worker (start one with `dtask worker`, or `dtask up`)")
        return EXIT_OK
    print(f"{'NAME':<32} {'SLOTS':>5}  {'SEEN':>6}  QUEUES")
    for w in found:
        print(f"{w.name:<32} {w.slots:>5}  {w.seen_ago:>5.1f}s  {', '.join(w.queues)}")
    return EXIT_OK


def _cmd_config(args: argparse.Namespace) -> int:
    import json

    from dtask import settings

    found = settings.rows(settings.load())
    if args.json:
        print(json.dumps({row.name: {"value": row.value, "source": row.source} for row in found}))
    else:
        print("\n".join(settings.render(found)))
    return EXIT_OK


def _cmd_up(args: argparse.Namespace) -> int:
    import signal
    import threading

    from dtask.exceptions import DtaskError
    from dtask.local import supervisor
    from dtask.local.reload import Watch
    from dtask.local.stack import Stack
    from dtask.settings import load

    stack = Stack(
        workers=args.workers,
        concurrency=args.concurrency,
        flower=not args.no_flower,
        beat=not args.no_beat,
        flower_port=args.flower_port,
        api=not args.no_api,
        api_port=args.api_port,
    )
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    home = load().home
    if args.attach:
        if not supervisor.follow(home, sys.stdout, stopping.wait):
            raise ConfigurationError(f"no dtask up runs in {home}: start one with `dtask up`")
        return EXIT_OK
    with supervisor.one_stack(home) as record:
        try:
            stack.start()
            stack.wait_ready()
            described = stack.describe()
            record(described)
            print("dtask is up:")
            for line in described:
                print(f"  {line}")
            print("Ctrl-C stops everything.", flush=True)
            watch = Watch(stack.settings.templates) if args.reload and stack.settings else None
            if watch is not None:
                names = ", ".join(watch.modules) or "none: set DTASK_TEMPLATES"
                print(f"dtask up: reloading when a template module changes ({names})", flush=True)
            while not stopping.wait(1):
                changed = watch.changed() if watch is not None else []
                if changed:
                    print(f"dtask up: {', '.join(p.name for p in changed)} changed: reloading...")
                    try:
                        stack.reload()
                    except DtaskError as exc:  # a syntax error just saved: fix it, save again
                        print(f"dtask up: reload failed: {exc}; watching for the next change")
                    else:
                        print("dtask up: reloaded", flush=True)
                stack.supervise()
                sys.stdout.flush()
        finally:
            print("dtask up: stopping...", flush=True)
            stack.stop()
            print("dtask up: stopped", flush=True)
    return EXIT_OK


def _cmd_flower(args: argparse.Namespace) -> int:
    from dtask.local.stack import flower_auth
    from dtask.services.extras import require
    from dtask.worker import configure

    require("flower", "flower", "dtask flower")
    auth = flower_auth(args.address)
    app = configure()
    os.environ["FLOWER_BASIC_AUTH"] = auth  # not on the command line, where ps shows it
    os.environ.pop("FLOWER_UNAUTHENTICATED_API", None)  # never: any web page could use it
    app.start(["flower", f"--port={args.port}", f"--address={args.address}"])
    return EXIT_OK


def _cmd_drain(args: argparse.Namespace) -> int:
    from dtask.exceptions import DtaskError
    from dtask.worker import configure

    app = configure()
    name = _full_worker_name(args.worker)
    if not app.control.ping(destination=[name], timeout=2):
        raise DtaskError(f"no worker {args.worker!r} answered (see `dtask workers`)")
    from dtask.worker.drain import DRAIN_COMMAND

    app.control.broadcast(DRAIN_COMMAND, destination=[name])
    print(f"worker {name} is handing over its running children and stopping")
    return EXIT_OK


def _full_worker_name(name: str) -> str:
    """``worker-1`` (as `dtask up` prints it) -> ``worker-1@host`` of the live worker that has
    it; a full name stays as it is."""
    if "@" in name:
        return name
    from dtask.client.workers import live_workers

    found = sorted(w.name for w in live_workers() if w.name.split("@", 1)[0] == name)
    if len(found) > 1:
        raise ConfigurationError(f"{name!r} names several workers ({', '.join(found)}): pick one")
    return found[0] if found else f"{name}@{socket.gethostname()}"


def _cmd_beat(args: argparse.Namespace) -> int:
    from dtask import services
    from dtask.worker import configure

    app = configure()
    services.store()  # fail now, in one line, if PostgreSQL is unreachable
    argv = ["--scheduler=dtask.worker.beat:DatabaseScheduler", "--loglevel=INFO"]
    from dtask.cli import celery_start  # click: only the commands that start Celery pay

    return celery_start.start(app, "beat", argv)


def tiered(extra: Sequence[str]) -> tuple[Tier, list[str]]:
    """``--tier NAME`` taken out of a worker's options, and its -Q/--queues (default: the
    default queue) replaced by the tier queues it serves, its own tier first."""
    tier, rest, queues = Tier.BASIC, [], []
    args = iter(extra)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name == "--tier":
            tier = tier_of(value if eq else next(args, ""))
        elif name in ("-Q", "--queues"):
            queues += (value if eq else next(args, "")).split(",")
        elif arg.startswith("-Q"):
            queues += arg[2:].split(",")
        else:
            rest.append(arg)
    if tier is Tier.BASIC and not queues:
        return tier, rest
    served = served_queues([q for q in queues if q] or [DEFAULT_QUEUE], tier)
    return tier, [*rest, "--queues", ",".join(served)]


def worker_argv(extra: Sequence[str]) -> list[str]:
    argv = list(extra)
    if not any(a in ("-n", "--hostname") or a.startswith("--hostname=") for a in extra):
        argv += ["--hostname", f"dtask-{os.getpid()}@%h"]
    if not any(a in ("-l", "--loglevel") or a.startswith("--loglevel=") for a in extra):
        argv += ["--loglevel", "INFO"]
    return argv


def run_worker(extra: Sequence[str]) -> int:
    from dtask import services
    from dtask.settings import is_redis
    from dtask.worker import configure
    from dtask.worker.adopt import install_worker_side

    tier, extra = tiered(extra)
    if {"-h", "--help"} & set(extra):  # Celery's help needs no services started
        from dtask.cli import celery_start
        from dtask.worker.app import app

        return celery_start.start(app, "worker", ["--help"])
    app = configure()
    services.import_database_driver()  # before any fork: see its docstring
    if tier is not Tier.BASIC and is_redis(str(app.conf.broker_url)):
        # take from the queues in the order given (own tier first), not round robin
        options = app.conf.broker_transport_options
        app.conf.broker_transport_options = {**options, "queue_order_strategy": "priority"}
    install_worker_side()
    from dtask.cli import celery_start

    return celery_start.start(app, "worker", worker_argv(extra))
