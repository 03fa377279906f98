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
from dtask.client.transactions import is_django_connection

# Submits of one process in flight at once; the rest wait their turn on the loop. A submit is
# mostly Python (the GIL's): each thread more takes the loop's turns, not the machine's cores.
# bench.async_submit, 100 at once: p50/p99 of a 10-ms ping 2/15 ms with 1 thread, 4/30 with 2,
# 28/44 with 4, 34/77 with 8, at the same 450-650 submits/s. Two: a submit that waits on the
# network (a remote PostgreSQL's round trips) does not hold every other one.
SUBMIT_THREADS = 2

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
    blocking the event loop. The caller's context (contextvars: a trace's span) goes along.

    On Django's connection (``using=``, or a Django ``connection=``) it runs where an async
    view's sync calls run (asgiref's ``sync_to_async(thread_sensitive=True)``): a Django
    connection belongs to its thread, and in a submit thread Django opened one of its own,
    apart from the view's and never closed."""
    call = partial(submit, template, variables, key, **options)
    if options.get("using") is not None or is_django_connection(options.get("connection")):
        from asgiref.sync import sync_to_async

        return await sync_to_async(call, thread_sensitive=True)()
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_executor(), context.run, call)
