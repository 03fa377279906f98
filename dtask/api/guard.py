"""What every request meets first: on a route that needs a token, the token is checked before
a byte of the body is read; then the body is bounded by DTASK_API_MAX_BODY (413 from its
Content-Length, or as soon as a streamed body passes it) and by DTASK_API_BODY_TIMEOUT (408
when the whole body has not arrived in that many seconds). A path that needs no token (the
dashboard's files, the OpenAPI document and its viewer) takes no body: one announced is refused
at once, unread. FastAPI reads a body before it runs a route's dependencies, so this cannot be
one: it is ASGI middleware, outside the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dtask import services
from dtask.api import auth, errors
from dtask.exceptions import DtaskError


class _Gone(Exception):
    """The client went away while its body was read."""


class Guard:
    def __init__(
        self, app: ASGIApp, needs_token: Callable[[str], bool], headers: Mapping[str, str]
    ) -> None:
        self.app = app
        self.needs_token = needs_token  # of a path, as the router sees it
        self.headers = headers  # of every answer of the app's own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        has_body = "content-length" in headers or "transfer-encoding" in headers
        try:
            if not self.needs_token(_route_path(scope)):
                if _announces_body(headers):  # none of the open paths takes one
                    raise _no_body()
            else:
                token = await run_in_threadpool(auth.verified, headers.get("authorization"))
                scope = {**scope, auth.TOKEN: token}
                if has_body:
                    receive = await _bounded(receive, headers, _limit(), _body_timeout())
        except _Gone:
            return
        except DtaskError as exc:
            answer = errors.response(exc)
            answer.headers.update(self.headers)
            if has_body:  # its body stays unread: the server must not read it to the end
                answer.headers["Connection"] = "close"
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _route_path(scope: Scope) -> str:
    """The path as the router matches it (Starlette's ``get_route_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :]
    return path


def _limit() -> int:
    return services.current().settings.api_max_body


def _body_timeout() -> float:
    return services.current().settings.api_body_timeout


def _announces_body(headers: Headers) -> bool:
    """A body of at least one byte may follow the head (``Content-Length: 0`` announces none)."""
    if "transfer-encoding" in headers:
        return True
    return any(v.strip() not in ("", "0") for v in headers.getlist("content-length"))


def _no_body() -> errors.Refused:
    return errors.Refused("this path takes no request body: send none", 413)


def _too_slow(seconds: float) -> errors.Refused:
    return errors.Refused(
        f"the request's body did not arrive within DTASK_API_BODY_TIMEOUT ({seconds:g} s)", 408
    )


def _too_large(limit: int) -> errors.Refused:
    return errors.Refused(
        f"the request's body is over DTASK_API_MAX_BODY ({limit} bytes): send less"
        " (fewer runs a batch)",
        413,
    )


async def _bounded(receive: Receive, headers: Headers, limit: int, seconds: float) -> Receive:
    """The body read whole, but never past ``limit`` bytes nor ``seconds``, and replayed to
    the app."""
    announced = headers.get("content-length", "")
    digits = announced.isascii() and announced.isdigit()
    if digits and (len(announced) > 12 or int(announced) > limit):
        raise _too_large(limit)
    chunks: list[bytes] = []
    try:
        async with asyncio.timeout(seconds):
            await _read(receive, chunks, limit)
    except TimeoutError:
        raise _too_slow(seconds) from None
    return _replay(chunks, receive)


async def _read(receive: Receive, chunks: list[bytes], limit: int) -> None:
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        more = message.get("more_body", False)


def _replay(chunks: list[bytes], receive: Receive) -> Receive:
    async def replayed() -> Message:
        if chunks:
            body = chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(chunks)}
        return await receive()  # then what follows the body: the client's disconnect

    return replayed
