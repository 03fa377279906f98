"""The Celery side: the app, the thin tasks (master, child, finalize) and chord dispatch."""

from dtask.worker.app import app, configure

__all__ = ["app", "configure"]
