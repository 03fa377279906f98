"""The Celery app. ``dtask.worker`` registers the tasks on it; ``configure`` applies the URLs."""

from __future__ import annotations

from celery import Celery

from dtask import services
from dtask.settings import load
from dtask.worker.config import celery_settings

app = Celery("dtask", set_as_current=False)
app.conf.update(celery_settings(load()))
_configured_for: services.Services | None = None


def configure() -> Celery:
    """Start/attach the services, load templates, point the app at them. Cheap to call again:
    the work is done once per resolved set of services (services.reset() starts over)."""
    global _configured_for
    resolved = services.ensure_broker()
    if _configured_for is not resolved:
        services.load_templates(resolved.settings)
        app.conf.update(celery_settings(resolved.settings))
        _configured_for = resolved
    return app
