"""dtask inside any Celery app: ``dtask.init_app(app)``.

It puts dtask's tasks on the host app and sends dtask's messages through it (its broker, its
result backend), reads ``dtask_*`` keys of its configuration where no DTASK_* variable is set,
and installs dtask's worker side through Celery's signals, so ``celery -A proj worker`` runs
what ``dtask worker`` runs: the reaper, the dispatcher, the notifier, the monitor, the
registry of live workers and the hand-over on SIGTERM.

Celery's signals are global: each handler applies only to a worker of the adopted app
(dtask/worker/scope.py), so a second, plain Celery app's worker in the same package is stock
Celery. Such a worker without ``-Q`` consumes dtask's queue beside its own; ``-Q`` says exactly
what it consumes. Prefetch 1 is dtask's only where dtask's queues are consumed: a worker of the
adopted app that consumes none of them keeps Celery's prefetch, and still runs the loops (the
reaper, the dispatcher, ...), which serve the cluster, not its own pool.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, celeryd_init, worker_init, worker_process_init
from celery.utils.text import str_to_list

from dtask import services, settings
from dtask.db.engine import as_pool_process
from dtask.domain.limits import over_budget
from dtask.domain.templates import registry as templates
from dtask.domain.tiers import base_queue
from dtask.exceptions import DtaskError
from dtask.worker import (
    dispatcher,
    drain,
    events,
    monitor,
    notifier,
    reaper,
    registry,
    scope,
    tasks,
)
from dtask.worker.app import use_host
from dtask.worker.config import DEFAULT_QUEUE

log = logging.getLogger("dtask.worker")
CELERY_DEFAULT_PREFETCH = 4
_UNSET = object()
_installed = False
_lowered: weakref.WeakSet[Celery] = weakref.WeakSet()  # apps whose default 4 became 1
_stock_prefetch = False  # this worker consumes none of dtask's queues: it gets the 4 back


def init_app(host: Celery) -> Celery:
    """Adopt ``host``: see the module's docstring. Returns it, so
    ``app = dtask.init_app(Celery("proj"))`` works too."""
    use_host(host)
    tasks.register(host)
    settings.use_source(lambda: host_settings(host), fixed=("broker_url", "result_backend"))
    services.reset()
    if host.configured:
        _worker_defaults(host)
    else:
        host.on_after_configure.connect(_worker_defaults, weak=False)
    install_worker_side()
    return host


def host_settings(host: Celery) -> dict[str, Any]:
    """``dtask_<setting>`` keys of the host's configuration, and its broker and backend (the
    ones messages go through, whatever a ``dtask_broker_url`` key says)."""
    conf = host.conf
    # conf.get, not "in": a key set under a namespace (Django's CELERY_DTASK_DATABASE_URL with
    # config_from_object(..., namespace="CELERY")) is found by lookup, never by membership
    found = {name: conf.get(f"dtask_{name}", _UNSET) for name in settings.Settings.model_fields}
    values = {name: value for name, value in found.items() if value is not _UNSET}
    values["broker_url"] = conf.broker_url or "amqp://guest@localhost//"
    values["result_backend"] = conf.result_backend or "disabled://"
    return values


def _worker_defaults(sender: Celery, **_: Any) -> None:
    """A child waits unclaimed in a worker that prefetched it behind a long one, where no
    other worker can take it: dtask needs one message per process. Celery's default (4)
    becomes 1 (so an explicit 4 does too); any other value is refused when a worker that
    consumes dtask's queues starts. A worker that consumes none of them gets 4 back."""
    if sender.conf.worker_prefetch_multiplier == CELERY_DEFAULT_PREFETCH:
        sender.conf.worker_prefetch_multiplier = 1
        _lowered.add(sender)


def install_worker_side() -> None:
    """What ``dtask worker`` adds to a Celery worker, through Celery's signals (they fire in
    a worker only: a web process that imports the app starts nothing). Once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    drain.install()  # first on worker_shutting_down: the hand-over starts before anything else
    registry.install()
    reaper.install()
    dispatcher.install()
    notifier.install()
    monitor.install()
    events.install()
    celeryd_init.connect(_before_start, weak=False)
    worker_init.connect(_import_driver, weak=False)
    worker_process_init.connect(_as_pool_process, weak=False)
    celeryd_after_setup.connect(_check_queues, weak=False)


def _before_start(
    sender: Any = None, instance: Any = None, conf: Any = None, options: Any = None, **_: Any
) -> None:
    global _stock_prefetch
    app: Any = getattr(instance, "app", None)
    if app is None or not scope.starting(app):
        return  # another app's worker: stock Celery
    options = options or {}
    _load_templates()
    queues = app.amqp.queues
    # Celery's Queues keeps the set a worker without -Q consumes as it was when made: add()
    # would only route to dtask's queue. select_add joins that set; -Q, applied after this
    # signal, still narrows the worker to what it names (then _check_queues warns).
    queues.select_add(DEFAULT_QUEUE)
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
    elif app in _lowered and not _on_command_line("prefetch_multiplier"):
        _stock_prefetch = True  # none of dtask's work here: Celery's default (at worker_init)
    _check_connections(str(sender or ""), options, conf)
    resolved = services.current().settings
    if resolved.embedded_database:
        print(
            f"dtask worker: using the embedded PostgreSQL and Redis in {resolved.home}, which only"
            " this machine sees (set DTASK_DATABASE_URL and DTASK_BROKER_URL for a cluster)",
            flush=True,
        )


def _load_templates() -> None:
    """The templates ``dtask_templates`` names, imported in the main process before the pool
    forks (as ``dtask worker`` does): every pool process knows them, and their queues count
    as dtask's. A module that fails is logged; its runs' masters then say so."""
    try:
        services.load_templates(services.current().settings)
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


def _check_connections(name: str, options: dict[str, Any], conf: Any) -> None:
    """Refuse to start where this worker and the live ones could together hold more
    PostgreSQL connections than the server allows (each pool stops at its size)."""
    autoscale = options.get("autoscale")
    concurrency = int(
        (str(autoscale).split(",")[0] if autoscale else None)
        or options.get("concurrency")
        or conf.worker_concurrency
        or os.cpu_count()
        or 1
    )
    try:
        resolved = services.current().settings
        store = services.store()
        most, usable = store.workers.server_connections()
        others = [
            w.slots for w in store.workers.live(resolved.worker_seen_within) if w.name != name
        ]
    except DtaskError as exc:  # PostgreSQL is down: the worker waits for it like any other
        log.warning("dtask: cannot check the PostgreSQL connection budget now: %s", exc)
        return
    refusal = over_budget(concurrency, resolved.db_pool, others, usable, most)
    if refusal is not None:
        print(f"dtask worker: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(2)


def _as_pool_process(**_: Any) -> None:
    if scope.this_worker():
        as_pool_process()


def _import_driver(sender: Any = None, **_: Any) -> None:
    if scope.serves(getattr(sender, "app", None)):
        services.import_database_driver()  # before the pool forks (its docstring says why)
        if _stock_prefetch:  # read from here on (the command line's value was the lowered 1)
            sender.prefetch_multiplier = CELERY_DEFAULT_PREFETCH


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
