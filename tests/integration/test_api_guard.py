"""The API's guard (dtask/api/guard.py) in process, against the session's PostgreSQL: the
token it checks before the body is the one the route uses, so a request looks it up once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message

from dtask import services
from dtask.api.app import create_app


async def _ask(method: str, path: str, secret: str, body: bytes = b"") -> tuple[int, Any]:
    headers = [(b"host", b"dtask"), (b"authorization", f"Bearer {secret}".encode())]
    if body:
        headers += [(b"content-type", b"application/json")]
        headers += [(b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": method, "scheme": "http", "path": path,
        "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        await asyncio.Event().wait()  # the client stays until the answer is complete
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    await create_app()(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(answer) if answer else None


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/api/v1/me", b"", 200),
        ("GET", "/api/v1/clients", b"", 200),  # admin: a dependency on the caller's token
        ("POST", "/api/v1/runs", b'{"template": "no_such_template"}', 404),
    ],
)
def test_a_request_looks_its_token_up_once(
    dtask_env: dict[str, str],
    statements: list[str],
    method: str,
    path: str,
    body: bytes,
    status: int,
) -> None:
    _, secret = services.store().tokens.create("default", admin=True)
    statements.clear()
    answered = asyncio.run(_ask(method, path, secret, body))
    assert answered[0] == status, answered
    assert sum("dtask_tokens" in s for s in statements) == 1, statements
