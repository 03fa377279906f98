"""A request's W3C trace context (``traceparent``, ``tracestate``) made current while the API
answers it, so the run it submits continues the caller's trace (docs/traces.md)."""

from __future__ import annotations

from typing import Any

from dtask import tracing

_HEADERS = (b"traceparent", b"tracestate")


class TraceContext:
    """ASGI middleware: nothing but a pass-through where nothing is traced."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in _HEADERS
        }
        with tracing.continued(headers):
            await self.app(scope, receive, send)
