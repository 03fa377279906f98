"""`dtask serve`: the API and dashboard on uvicorn, after the services and templates are
ready, with the alert monitor beside it."""

from __future__ import annotations

import logging

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
        uvicorn.run(create_app(), host=host, port=port, log_level="info")
    finally:
        alerts.stop()
