"""dtask inside any Celery app: ``dtask.init_app(app)``.

It puts dtask's tasks on the host app and sends dtask's messages through it (its broker, its
result backend), reads ``dtask_*`` keys of its configuration where no DTASK_* variable is set,
and installs dtask's worker side through Celery's signals, so ``celery -A proj worker`` runs
what ``dtask worker`` runs: the reaper, the dispatcher, the notifier, the monitor, the
registry of live workers and the hand-over on SIGTERM.

Adopting is light: a web process or beat that imports the app loads neither SQLAlchemy nor
the worker's modules until it first submits; a worker loads them as it starts (its
``celeryd_init``, dtask/worker/startup.py), before its pool forks.

Celery's signals are global: each handler applies only to a worker of the adopted app
(dtask/worker/scope.py), so a second, plain Celery app's worker in the same package is stock
Celery. Such a worker without ``-Q`` consumes dtask's queue beside its own; ``-Q`` says exactly
what it consumes. Prefetch 1 is dtask's only where dtask's queues are consumed: a worker of the
adopted app that consumes none of them keeps Celery's prefetch, and still runs the loops (the
reaper, the dispatcher, ...), which serve the cluster, not its own pool.
"""

from __future__ import annotations

import sys
from typing import Any

from celery import Celery
from celery.signals import celeryd_init

from dtask import settings_source
from dtask.worker import scope, task_table
from dtask.worker.app import use_host

_UNSET = object()
_installed = False


def init_app(host: Celery) -> Celery:
    """Adopt ``host``: see the module's docstring. Returns it, so
    ``app = dtask.init_app(Celery("proj"))`` works too."""
    use_host(host)
    task_table.register(host)
    settings_source.use_source(lambda: host_settings(host), fixed=("broker_url", "result_backend"))
    services = sys.modules.get("dtask.services")
    if services is not None:  # services resolved before the host's settings: start over
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
    from dtask.settings import Settings

    conf = host.conf
    # conf.get, not "in": a key set under a namespace (Django's CELERY_DTASK_DATABASE_URL with
    # config_from_object(..., namespace="CELERY")) is found by lookup, never by membership
    found = {name: conf.get(f"dtask_{name}", _UNSET) for name in Settings.model_fields}
    values = {name: value for name, value in found.items() if value is not _UNSET}
    values["broker_url"] = conf.broker_url or "amqp://guest@localhost//"
    values["result_backend"] = conf.result_backend or "disabled://"
    return values


def _worker_defaults(sender: Celery, **_: Any) -> None:
    """A child waits unclaimed in a worker that prefetched it behind a long one, where no
    other worker can take it: dtask needs one message per process. Celery's default (4)
    becomes 1 (so an explicit 4 does too); any other value is refused when a worker that
    consumes dtask's queues starts. A worker that consumes none of them gets 4 back."""
    if sender.conf.worker_prefetch_multiplier == scope.CELERY_DEFAULT_PREFETCH:
        sender.conf.worker_prefetch_multiplier = 1
        scope.lowered.add(sender)


def install_worker_side() -> None:
    """What ``dtask worker`` adds to a Celery worker, from Celery's ``celeryd_init`` (sent in
    a worker only: a web process that imports the app starts and loads nothing). Once per
    process."""
    global _installed
    if _installed:
        return
    _installed = True
    celeryd_init.connect(_starting, weak=False)


def _starting(sender: Any = None, instance: Any = None, **kwargs: Any) -> None:
    from dtask.worker import startup

    startup.install()
    startup.before_start(sender=sender, instance=instance, **kwargs)
