"""The Celery app dtask sends through: its own (``dtask worker``, ``dtask submit``), or the
host's once ``dtask.init_app(app)`` adopted one. ``configure`` applies the URLs to its own.

Light to import (``dtask.init_app`` in a web process): the services and settings are loaded
when dtask is first used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery

if TYPE_CHECKING:
    from dtask.services import Services


def _own_defaults() -> dict[str, Any]:
    from dtask.settings import load
    from dtask.worker.config import celery_settings

    return celery_settings(load())


app = Celery("dtask", set_as_current=False)
# read when its configuration is first used, not at import: under a host app (dtask.init_app)
# dtask's own app is never configured, and DTASK_* alone may not be valid there
app.add_defaults(_own_defaults)
_host: Celery | None = None
_configured_for: Services | None = None


def current() -> Celery:
    """The app dtask's messages go through: the adopted host's, else dtask's own."""
    return _host if _host is not None else app


def use_host(host: Celery | None) -> None:
    """Send through ``host`` (its broker, result backend and settings) from now on."""
    global _host, _configured_for
    _host, _configured_for = host, None


def configure() -> Celery:
    """Start/attach the services, load templates, point the app at them. Cheap to call again:
    the work is done once per resolved set of services (services.reset() starts over). A host
    app keeps its own broker and backend settings."""
    from dtask import services, templating
    from dtask.worker.config import celery_settings

    global _configured_for
    resolved = services.ensure_broker()
    if _configured_for is not resolved:
        templating.load_templates(resolved.settings)
        if _host is None:
            app.conf.update(celery_settings(resolved.settings))
        _configured_for = resolved
    return current()
