"""Celery settings read from the environment (DTASK_*), for `celery -A dtask.worker.app ...`.

`dtask worker` applies the same settings itself; this module exists for tools that expect a
Celery config module.
"""

from dtask.settings import load
from dtask.worker.config import celery_settings

globals().update(celery_settings(load()))
