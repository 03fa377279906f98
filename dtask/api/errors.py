"""One JSON error shape for every failure: ``{"error": "<one line>"}`` (plus ``fields`` for
bad variables or a bad body), with the status code the error's kind calls for."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from dtask import exceptions as e

log = logging.getLogger("dtask.api")

STATUS: list[tuple[type[e.DtaskError], int]] = [  # the first kind an error is decides
    (e.RateLimited, 429),
    (e.ServiceUnavailable, 503),
    (e.UpstreamNotFound, 422),  # a run the body names: the request is at fault, not the path
    (e.NotFound, 404),
    (e.Conflict, 409),
    (e.Invalid, 422),
]


class Refused(e.DtaskError):
    """The caller may not do this (401 without a valid token, 403 beyond its rights, 413 a
    body over DTASK_API_MAX_BODY)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def status_of(error: e.DtaskError) -> int:
    if isinstance(error, Refused):
        return error.status
    return next((code for kind, code in STATUS if isinstance(error, kind)), 400)


def _dtask_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.DtaskError)
    return response(exc)


def response(exc: e.DtaskError) -> JSONResponse:
    """The error's JSON answer, with the status and headers its kind calls for."""
    body: dict[str, Any] = {"error": _encodable(_public(exc))}
    headers: dict[str, str] = {}
    if isinstance(exc, e.InvalidVariables) and exc.fields:
        body["fields"] = {_encodable(k): _encodable(v) for k, v in exc.fields.items()}
    if isinstance(exc, e.RateLimited | e.Busy):
        body["retry_after"] = None if math.isinf(exc.retry_after) else exc.retry_after
        if not math.isinf(exc.retry_after):
            headers["Retry-After"] = str(math.ceil(exc.retry_after))
    if isinstance(exc, Refused) and exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status_of(exc), headers=headers)


def _public(exc: e.DtaskError) -> str:
    """What a caller may read of ``exc``: a database's errors name its URL (user, host,
    database), so they are told apart only in the server's log."""
    if isinstance(exc, e.DatabaseUnavailable):
        log.warning("answered 503: %s", exc)
        return "cannot reach the database (the server's log has the details)"
    if isinstance(exc, e.SchemaMismatch):
        log.warning("answered %d: %s", status_of(exc), exc)
        return "the database's dtask schema is not this server's (the server's log has the details)"
    return str(exc)


def _encodable(text: str) -> str:
    """``text`` as JSON can send it: a caller's lone surrogate (``"\\ud800"`` in a JSON body)
    escaped, where UTF-8 would refuse it and turn the answer into a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    kind = request.headers.get("content-type", "")
    if (
        request.method == "POST"
        and "json" not in kind
        and any(err["loc"] == ("body",) for err in exc.errors())
    ):
        return JSONResponse(
            {"error": f"send the body as JSON with Content-Type: application/json, not {kind!r}"
             " (curl --json '{...}')"},
            status_code=415,
        )  # fmt: skip
    fields = {
        ".".join(_shown(p) for p in err["loc"] if p != "body") or "body": _shown(err["msg"])
        for err in exc.errors()
    }
    first = next(iter(fields.items()))
    return JSONResponse({"error": f"{first[0]}: {first[1]}", "fields": fields}, status_code=422)


def _shown(part: object) -> str:
    """A field's name or message as one short line: a body's keys are the caller's text."""
    text = str(part)
    if not text.isprintable() or len(text) > 80:
        text = repr(text[:60]) + ("..." if len(text) > 60 else "")
    return text


def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"error": _encodable(str(exc.detail))}, status_code=exc.status_code)


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return JSONResponse({"error": "internal error (the server's log has the details)"}, 500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(e.DtaskError, _dtask_error)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
