"""Who is calling: the token in ``Authorization: Bearer <token>``, checked on every request
by :class:`dtask.api.guard.Guard` before its body is read, and handed to the route."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from dtask import services
from dtask.api.errors import Refused
from dtask.domain.tokens import Token

TOKEN = "dtask.token"  # the scope key of the guard's token: the route does not look it up again


def verified(authorization: str | None) -> Token:
    """The live token of an ``Authorization`` header (one lookup in PostgreSQL), or a 401."""
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Refused(
            "a token is required: Authorization: Bearer <token> (`dtask token create`)", 401
        )
    token = services.store().tokens.find(secret.strip())
    if token is None:
        raise Refused("this token is not valid (unknown or revoked)", 401)
    return token


async def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Token:
    checked = request.scope.get(TOKEN)
    if isinstance(checked, Token):
        return checked
    return await run_in_threadpool(verified, authorization)


async def admin(token: Annotated[Token, Depends(caller)]) -> Token:
    if not token.admin:
        raise Refused("only an admin token may do this (`dtask token create --admin`)", 403)
    return token


Caller = Annotated[Token, Depends(caller)]
Admin = Annotated[Token, Depends(admin)]
