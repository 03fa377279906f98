"""asyncio verbs for ASGI applications (FastAPI, Starlette): ``await dtask.asubmit(...)``,
``await template.adelay(...)`` (and ``await run.aget()``, dtask/client/awaiting.py).

A submit is ``dtask.submit`` run in a thread of a small pool of this process's own: it is a
few short transactions (the key, the client's rates, the upstreams, the insert) and the master
message's publish, whose every guarantee (once per key, nothing half-created when the broker is
down, test mode) it keeps as it is. The loop only awaits it; the bounded pool keeps a burst of
submits from taking more threads than the process's connection pool could serve.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from dtask.client.runs import Run, submit

SUBMIT_THREADS = 8  # submits of one process in flight at once; the rest wait their turn

_pool: tuple[int, ThreadPoolExecutor] | None = None
_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:  # a forked process makes its own: threads do not cross a fork
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(SUBMIT_THREADS, "dtask-asubmit"))
        return _pool[1]


async def asubmit(
    template: str, variables: dict[str, Any], key: str | None = None, **options: Any
) -> Run:
    """``dtask.submit`` for asyncio code: the same arguments, result and errors, without
    blocking the event loop. The caller's context (contextvars: a trace's span) goes along."""
    call = partial(submit, template, variables, key, **options)
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_executor(), context.run, call)
