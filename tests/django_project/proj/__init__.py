# Celery's documented layout: the app is loaded when Django starts, so @shared_task uses it.
from .celery import app as celery_app

__all__ = ("celery_app",)
