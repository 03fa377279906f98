"""The ASGI app: ``/api/v1`` with its OpenAPI document at ``/api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api import errors, runs, schedules
from dtask.api.auth import Admin, Caller

PREFIX = "/api/v1"
other = APIRouter(tags=["cluster"])


def _templates() -> list[dict[str, Any]]:
    from dtask.domain.templates import registry

    return [
        {
            "name": t.name,
            "params": {
                n: {"type": p.type_name, "required": p.required, "default": p.default}
                for n, p in t.params.items()
            },
            "queue": t.options.queue,
            "tier": (t.options.tier.value if t.options.tier else None),
        }
        for t in registry.all()
    ]


@other.get("/templates")
async def list_templates(token: Caller) -> list[dict[str, Any]]:
    """The registered templates with their parameters."""
    return _templates()


@other.get("/workers")
async def list_workers(token: Caller) -> list[dict[str, object]]:
    """The live workers: queues, child slots, last seen."""
    within = services.current().settings.worker_seen_within
    found = await run_in_threadpool(services.store().workers.live, within)
    return [w.as_json() for w in found]


@other.get("/clients")
async def list_clients(token: Admin) -> list[dict[str, Any]]:
    """Every client's settings (admin tokens only)."""
    found = await run_in_threadpool(services.store().clients.list)
    return [c.as_json() for c in found]


def create_app() -> FastAPI:
    app = FastAPI(
        title="dtask",
        version="1",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
    )
    errors.install(app)
    app.include_router(runs.router, prefix=PREFIX)
    app.include_router(schedules.router, prefix=PREFIX)
    app.include_router(other, prefix=PREFIX)
    return app
