"""`dtask serve`: the API on uvicorn, after the services and templates are ready."""

from __future__ import annotations

import uvicorn

from dtask.api.app import PREFIX, create_app
from dtask.worker import configure


def serve(host: str, port: int) -> None:
    configure()  # services (embedded or not), the templates, the Celery app's URLs
    print(
        f"dtask serve: http://{host}:{port}{PREFIX} (docs at {PREFIX}/docs); every request"
        " needs a token (`dtask token create --client NAME`)",
        flush=True,
    )
    uvicorn.run(create_app(), host=host, port=port, log_level="info")
