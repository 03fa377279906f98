"""The ASGI app: ``/api/v1`` with its OpenAPI document at ``/api/v1/openapi.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api import errors, metrics, runs, schedules, traces
from dtask.api.auth import Admin, Caller
from dtask.api.guard import Guard

PREFIX = "/api/v1"
OPEN = {f"{PREFIX}/openapi.json", f"{PREFIX}/docs"}  # they describe the API: no data
DASHBOARD = Path(__file__).with_name("dashboard")
# The page loads only its own script and style and talks only to this server; no framing.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
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


@other.get("/me")
async def who_am_i(token: Caller) -> dict[str, Any]:
    """Whom this token acts for."""
    return {"client": token.client, "admin": token.admin}


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
    """Every client's settings and current use (admin tokens only)."""
    found = await run_in_threadpool(services.store().clients.list, True)
    return [c.as_json() for c in found]


def needs_token(path: str) -> bool:
    """Every path of the API and /metrics, known or not, but those in OPEN; the dashboard's
    files are the page's own (its data comes from the API)."""
    api = path == PREFIX or path.startswith(f"{PREFIX}/") or path == "/metrics"
    return api and path not in OPEN


def create_app() -> FastAPI:
    app = FastAPI(
        title="dtask",
        version="1",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
    )
    errors.install(app)
    app.add_middleware(GZipMiddleware, minimum_size=2048)
    app.add_middleware(traces.TraceContext)

    @app.middleware("http")
    async def page_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        if request.url.path == app.docs_url:  # Swagger UI: FastAPI's page loads it from a CDN
            response.headers["X-Frame-Options"] = "DENY"
        else:
            response.headers.update(PAGE_HEADERS)
        return response

    app.include_router(runs.router, prefix=PREFIX)
    app.include_router(schedules.router, prefix=PREFIX)
    app.include_router(other, prefix=PREFIX)
    app.include_router(metrics.alerts, prefix=PREFIX)
    app.include_router(metrics.router)
    # Last: the dashboard answers every path the API does not (its data needs a token).
    app.mount("/", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    # Added last, so outermost: nothing before it reads a body (docs/api.md, "Request bodies").
    app.add_middleware(Guard, needs_token=needs_token, headers=PAGE_HEADERS)
    return app
