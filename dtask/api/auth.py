"""Who is calling: the token in ``Authorization: Bearer <token>``, checked on every request."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from dtask import services
from dtask.api.errors import Refused
from dtask.domain.tokens import Token


def caller(authorization: Annotated[str | None, Header()] = None) -> Token:
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise Refused(
            "a token is required: Authorization: Bearer <token> (`dtask token create`)", 401
        )
    token = services.store().tokens.find(secret.strip())
    if token is None:
        raise Refused("this token is not valid (unknown or revoked)", 401)
    return token


def admin(token: Annotated[Token, Depends(caller)]) -> Token:
    if not token.admin:
        raise Refused("only an admin token may do this (`dtask token create --admin`)", 403)
    return token


Caller = Annotated[Token, Depends(caller)]
Admin = Annotated[Token, Depends(admin)]
