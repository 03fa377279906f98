"""The Celery side: the app, the thin tasks (master, child, finalize), chord dispatch, the
reaper, beat's scheduler, heartbeats and the drain hand-over.

Importing the package loads only the app (dtask/worker/app.py): ``load`` imports what defines
dtask's tasks on it and what a revoke of one means, in a worker's main process before its pool
forks (dtask/worker/startup.py) and wherever tasks run in process."""

from dtask.worker.app import app, configure


def load() -> None:
    """Import the modules that define dtask's tasks (several children in one message; master,
    child, finalize, submit, chains) and its revoke handler."""
    import dtask.worker.batch
    import dtask.worker.pickup
    import dtask.worker.revoke
    import dtask.worker.tasks  # noqa: F401


__all__ = ["app", "configure", "load"]
