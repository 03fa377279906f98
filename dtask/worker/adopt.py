"""dtask inside any Celery app: ``dtask.init_app(app)``.

It puts dtask's tasks on the host app and sends dtask's messages through it (its broker, its
result backend), reads ``dtask_*`` keys of its configuration where no DTASK_* variable is set,
and installs dtask's worker side through Celery's signals, so ``celery -A proj worker`` runs
what ``dtask worker`` runs: the reaper, the dispatcher, the notifier, the monitor, the
registry of live workers and the hand-over on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup, celeryd_init, worker_init, worker_process_init

from dtask import services, settings
from dtask.db.engine import as_pool_process
from dtask.domain.limits import over_budget
from dtask.exceptions import DtaskError
from dtask.worker import dispatcher, drain, events, monitor, notifier, reaper, registry, tasks
from dtask.worker.app import use_host
from dtask.worker.config import DEFAULT_QUEUE

log = logging.getLogger("dtask.worker")
CELERY_DEFAULT_PREFETCH = 4
_installed = False


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
    values = {
        name: conf[f"dtask_{name}"]
        for name in settings.Settings.model_fields
        if f"dtask_{name}" in conf
    }
    values["broker_url"] = conf.broker_url or "amqp://guest@localhost//"
    values["result_backend"] = conf.result_backend or "disabled://"
    return values


def _worker_defaults(sender: Celery, **_: Any) -> None:
    """A child waits unclaimed in a worker that prefetched it behind a long one, where no
    other worker can take it: dtask needs one message per process. Celery's default (4)
    becomes 1 (so an explicit 4 does too); any other value is refused when a worker starts."""
    if sender.conf.worker_prefetch_multiplier == CELERY_DEFAULT_PREFETCH:
        sender.conf.worker_prefetch_multiplier = 1


def install_worker_side() -> None:
    """What ``dtask worker`` adds to a Celery worker, through Celery's signals (they fire in
    a worker only: a web process that imports the app starts nothing). Once per process."""
    global _installed
    if _installed:
        return
    _installed = True
    registry.install()
    reaper.install()
    dispatcher.install()
    notifier.install()
    monitor.install()
    drain.install()
    events.install()
    celeryd_init.connect(_before_start, weak=False)
    worker_init.connect(_import_driver, weak=False)
    worker_process_init.connect(_as_pool_process, weak=False)
    celeryd_after_setup.connect(_check_queues, weak=False)


def _before_start(
    sender: Any = None, instance: Any = None, conf: Any = None, options: Any = None, **_: Any
) -> None:
    given = (options or {}).get("prefetch_multiplier")
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
    _check_connections(str(sender or ""), options or {}, conf)
    # Consumed unless -Q narrows the worker to other queues (then _check_queues says so).
    instance.app.amqp.queues.add(DEFAULT_QUEUE)
    resolved = services.current().settings
    if resolved.embedded_database:
        print(
            f"dtask worker: using the embedded PostgreSQL and Redis in {resolved.home}, which only"
            " this machine sees (set DTASK_DATABASE_URL and DTASK_BROKER_URL for a cluster)",
            flush=True,
        )


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
    as_pool_process()


def _import_driver(**_: Any) -> None:
    services.import_database_driver()  # before the pool forks (its docstring says why)


def _check_queues(instance: Any = None, **_: Any) -> None:
    consumed = {q.name for q in instance.app.amqp.queues.consume_from.values()}
    if not any(q == DEFAULT_QUEUE or q.startswith(f"{DEFAULT_QUEUE}.") for q in consumed):
        log.warning(
            "dtask: this worker consumes %s but none of dtask's queues: it starts no run and no"
            " child (its reaper and dispatcher still serve the cluster); add -Q ...,%s",
            ",".join(sorted(consumed)),
            DEFAULT_QUEUE,
        )
