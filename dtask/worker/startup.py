"""A worker of the adopted app (or ``dtask worker``) starting: what ``dtask.init_app`` defers
to Celery's ``celeryd_init`` so that a process that only sends loads none of it.

``install`` imports dtask's tasks and loops and connects their handlers; ``before_start``
checks the worker before its pool forks: the queues it consumes, its prefetch, the connection
budget (see dtask/worker/adopt.py for the whole story)."""

from __future__ import annotations

import gc
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from celery.signals import celeryd_after_setup, worker_init, worker_process_init
from celery.utils.text import str_to_list

from dtask import services, templating
from dtask.db import pooler
from dtask.db.engine import as_pool_process, as_prefork_main
from dtask.domain.limits import over_budget, short_at_peak, worker_connections
from dtask.domain.templates import registry as templates
from dtask.domain.tiers import base_queue
from dtask.exceptions import DtaskError
from dtask.worker import (
    dispatcher,
    drain,
    events,
    finalize,
    load,
    loop,
    monitor,
    notifier,
    presence,
    reaper,
    scope,
)
from dtask.worker.config import DEFAULT_QUEUE

log = logging.getLogger("dtask.worker")
_stock_prefetch = False  # this worker consumes none of dtask's queues: it gets the 4 back
_installed = False


def install() -> None:
    """dtask's tasks and worker-side handlers, once per process, from its first celeryd_init
    (every later worker signal fires after it)."""
    global _installed
    if _installed:
        return
    _installed = True
    load()
    drain.install()  # first on worker_shutting_down: the hand-over starts before anything else
    presence.install()
    settings = services.current().settings
    window = [dispatcher.loop(settings)] if settings.dispatch == "window" else []
    loop.in_worker([reaper.loop(settings), *window, notifier.loop(), monitor.loop()])
    finalize.install()  # Celery before 5.7: a chord part counted after its run ended is swept
    worker_init.connect(_import_driver, weak=False)
    worker_init.connect(_freeze_heap, weak=False)
    worker_process_init.connect(_as_pool_process, weak=False)
    celeryd_after_setup.connect(_check_queues, weak=False)


def before_start(
    sender: Any = None, instance: Any = None, conf: Any = None, options: Any = None, **_: Any
) -> None:
    global _stock_prefetch
    app: Any = getattr(instance, "app", None)
    if app is None or not scope.starting(app):
        return  # another app's worker: stock Celery
    events.add_step(instance)
    options = options or {}
    pool = _pool_name(options.get("pool") or conf.worker_pool)
    if pool == "prefork":
        as_prefork_main()  # before any store of this process: its loops share two connections
    _load_templates()
    queues = app.amqp.queues
    # Celery's Queues keeps the set a worker without -Q consumes as it was when made: add()
    # would only route to dtask's queue. select_add joins that set; -Q, applied after this
    # signal, still narrows the worker to what it names (then _check_queues warns). The queue
    # as the app declares it (its task_queues entry, or Celery's default or missing queue with
    # their queue type): select_add of a bare name would declare a classic queue.
    try:
        ours = queues[DEFAULT_QUEUE]
    except KeyError:  # task_create_missing_queues off and not among its task_queues
        ours = DEFAULT_QUEUE
    queues.select_add(ours)
    _check_queue(app, queues[DEFAULT_QUEUE])
    given = options.get("prefetch_multiplier")
    if _consumes_dtask(_consumed(queues, options)):
        prefetch = conf.worker_prefetch_multiplier if given is None else given
        if int(prefetch) != 1:
            print(
                f"dtask: worker_prefetch_multiplier is {prefetch}; dtask's children need 1 (a"
                " prefetched child waits behind a long one where no other worker can take it):"
                " remove the setting or pass --prefetch-multiplier 1",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2)
    elif app in scope.lowered and not _on_command_line("prefetch_multiplier"):
        _stock_prefetch = True  # none of dtask's work here: Celery's default (at worker_init)
    _check_pool(pool)
    _check_connections(str(sender or ""), options, conf, pool)
    resolved = services.current().settings
    if resolved.embedded_database:
        print(
            f"dtask worker: using the embedded PostgreSQL and Redis in {resolved.home}, which only"
            " this machine sees (set DTASK_DATABASE_URL and DTASK_BROKER_URL for a cluster)",
            flush=True,
        )


def _check_queue(app: Any, queue: Any) -> None:
    """On RabbitMQ, dtask's queue declared as the worker will declare it: one that exists with
    other arguments (a classic queue, DTASK_RABBITMQ_QUEUE_TYPE=quorum) is one line and exit
    2, not Celery's traceback. A broker that does not answer is left to Celery's retries."""
    if not str(app.conf.broker_url).startswith("amqp"):
        return
    with app.connection_for_write() as conn:
        try:
            conn.connect()  # one attempt: a broker that does not answer is Celery's to retry
            queue.bind(conn.default_channel).declare()
        except conn.connection_errors:
            return
        except conn.channel_errors as exc:
            why = getattr(exc, "reply_text", str(exc))
            print(
                f"dtask: RabbitMQ refuses queue {queue.name!r} as this worker declares it"
                f" ({why}): a queue keeps the type it was made with; delete it (or use a new"
                " vhost) to change DTASK_RABBITMQ_QUEUE_TYPE",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(2) from None


def _load_templates() -> None:
    """The templates ``dtask_templates`` names, imported in the main process before the pool
    forks (as ``dtask worker`` does): every pool process knows them, and their queues count
    as dtask's. A module that fails is logged; its runs' masters then say so."""
    try:
        templating.load_templates(services.current().settings)
    except DtaskError as exc:
        log.warning("dtask: %s", exc)


def _consumed(queues: Any, options: dict[str, Any]) -> set[str]:
    """The queues the worker starting with ``options`` will consume, as Celery's
    ``setup_queues`` (after celeryd_init) selects them: -Q's, else the default set; less -X's."""
    include = [q for q in str_to_list(options.get("queues") or []) if q]
    exclude = set(str_to_list(options.get("exclude_queues") or []))
    names = include or [q.name for q in queues.consume_from.values()]
    return {name for name in names if name not in exclude}


def _consumes_dtask(consumed: Iterable[str]) -> bool:
    """Whether any of ``consumed`` is dtask's: its queue, a template's, or a tier of either."""
    own = {DEFAULT_QUEUE} | {t.options.queue for t in templates.all() if t.options.queue}
    return any(base_queue(name) in own for name in consumed)


GREEN_POOLS = ("gevent", "eventlet")


def _check_pool(pool: str) -> None:
    """Refuse a green-thread pool in one line: a child's heartbeat is a thread of its own and
    its PostgreSQL calls block, so on one hub a busy child would starve its own lease."""
    if pool in GREEN_POOLS:
        print(
            f"dtask worker: -P {pool} cannot run dtask's children (their heartbeats and"
            " PostgreSQL calls block the hub, so a busy child would lose its lease): use"
            " -P prefork (the default) or -P threads",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(2)


def _check_connections(name: str, options: dict[str, Any], conf: Any, pool: str) -> None:
    """Refuse to start where this worker's connections (each pool stops at its size) do not
    fit beside those in use now; warn where the live workers at their busiest would not."""
    autoscale = options.get("autoscale")
    concurrency = int(
        (str(autoscale).split(",")[0] if autoscale else None)
        or options.get("concurrency")
        or conf.worker_concurrency
        or os.cpu_count()
        or 1
    )
    forks = pool == "prefork"
    try:
        resolved = services.current().settings
        store = services.store()
        server = store.workers.server_connections()
        others = [
            worker_connections(w.slots, resolved.db_pool)
            for w in store.workers.live(resolved.worker_seen_within)
            if w.name != name
        ]
    except DtaskError as exc:  # PostgreSQL is down: the worker waits for it like any other
        log.warning("dtask: cannot check the PostgreSQL connection budget now: %s", exc)
        return
    mine = worker_connections(concurrency, resolved.db_pool, forks)
    how = f"concurrency {concurrency} ({pool} pool" + (
        ")" if forks else f", DTASK_DB_POOL {resolved.db_pool})"
    )
    if server.pooled:  # its clients are what it limits; the server's are its own few
        found = pooler.client_limit(services.database_url(), resolved.network_timeout)
        if isinstance(found, str):
            log.warning(
                "dtask: cannot read the transaction pooler's client limit (%s), so its"
                " connections are not checked: let this database user read its admin"
                " console (admin_users or stats_users; docs/scaling.md)",
                found,
            )
            return
        limit = "PgBouncer's max_client_conn allows"
        refusal = over_budget(
            mine, found.in_use, found.most, limit, how, remedy="raise max_client_conn"
        )
    else:
        limit = f"the server's max_connections of {server.most} leaves"
        refusal = over_budget(mine, server.in_use, server.usable, limit, how)
    if refusal is not None:
        print(f"dtask worker: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    if server.pooled:
        return
    warning = short_at_peak(mine, others, server.usable)
    if warning is not None:
        log.warning("dtask: %s", warning)


def _pool_name(pool: Any) -> str:
    """Celery's name of a pool given as a name, an alias or (by then, often) its class."""
    if isinstance(pool, type):
        name = pool.__module__.rsplit(".", 1)[-1]  # celery.concurrency.<name>.TaskPool
    else:
        name = str(pool or "prefork").rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()
    return {"processes": "prefork", "thread": "threads"}.get(name, name)


def _as_pool_process(**_: Any) -> None:
    if scope.this_worker():
        as_pool_process()


def _import_driver(sender: Any = None, **_: Any) -> None:
    if scope.serves(getattr(sender, "app", None)):
        services.import_database_driver()  # before the pool forks (its docstring says why)
        if _stock_prefetch:  # read from here on (the command line's value was the lowered 1)
            sender.prefetch_multiplier = scope.CELERY_DEFAULT_PREFETCH


def _freeze_heap(sender: Any = None, **_: Any) -> None:
    """Celery collects garbage before it forks each pool process: 0.13 s of CPU each here,
    nearly all of it spent on the heap the imports left. Frozen once before the pool starts,
    that heap is not scanned again, and the pool processes share its pages rather than copy
    them as their own collector touches them (the gc module's advice for fork without exec)."""
    if scope.serves(getattr(sender, "app", None)):
        gc.freeze()


def _on_command_line(option: str) -> bool:
    """Whether the running ``celery worker`` command got ``option`` on its command line (its
    value otherwise comes from the configuration, already lowered)."""
    import click
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(option) is ParameterSource.COMMANDLINE


def _check_queues(instance: Any = None, **_: Any) -> None:
    if not scope.serves(instance.app):
        return
    consumed = {q.name for q in instance.app.amqp.queues.consume_from.values()}
    if not _consumes_dtask(consumed):
        log.warning(
            "dtask: this worker consumes %s but none of dtask's queues: it starts no run and no"
            " child (its reaper and dispatcher still serve the cluster); add -Q ...,%s",
            ",".join(sorted(consumed)),
            DEFAULT_QUEUE,
        )
