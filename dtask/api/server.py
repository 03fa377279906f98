"""`dtask serve`: the API and dashboard on uvicorn, after the services and templates are
ready, with the alert monitor beside it."""

from __future__ import annotations

import logging
import resource

import uvicorn

from dtask.api.app import PREFIX, create_app
from dtask.worker import configure, monitor


def serve(host: str, port: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    configure()  # services (embedded or not), the templates, the Celery app's URLs
    print(
        f"dtask serve: http://{host}:{port}{PREFIX} (docs at {PREFIX}/docs); every request"
        " needs a token (`dtask token create --client NAME`)",
        flush=True,
    )
    alerts = monitor.loop()  # alerts keep coming when every worker is down
    alerts.start()
    try:
        uvicorn.run(
            create_app(),
            host=host,
            port=port,
            log_level="info",
            limit_concurrency=concurrency(),  # past it: 503 at once, its body unread
            timeout_keep_alive=KEEP_ALIVE,  # an idle connection between requests
            h11_max_incomplete_event_size=MAX_HEAD,  # a bigger head: 400 and closed
        )
    finally:
        alerts.stop()


KEEP_ALIVE = 5  # seconds
MAX_HEAD = 16 * 1024  # bytes of request line and headers: h11's default, said here
MAX_CONCURRENCY = 512  # connections and requests at once: at most this many bodies held


def concurrency() -> int:
    """DTASK_API_MAX_CONNECTIONS, else 512 or half the open-file limit if that is lower (the
    rest is for PostgreSQL, the broker, logs and the connections uvicorn still accepts)."""
    from dtask import services

    given = services.current().settings.api_max_connections
    if given is not None:
        return given
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONCURRENCY
    return max(16, min(MAX_CONCURRENCY, soft // 2))
