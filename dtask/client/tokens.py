"""API tokens for the HTTP API (`dtask serve`): one client's key, or an admin's."""

from __future__ import annotations

from dtask import services
from dtask.domain.clients import DEFAULT_CLIENT, check_name
from dtask.domain.tokens import Token


def create_token(client: str, admin: bool = False) -> tuple[Token, str]:
    """A token for ``client`` (it must exist: ClientNotFound) and its secret, shown only now."""
    store = services.store()
    if check_name(client) != DEFAULT_CLIENT:
        store.clients.get(client)
    return store.tokens.create(client, admin)


def list_tokens() -> list[Token]:
    return services.store().tokens.all()


def revoke_token(token_id: int) -> Token:
    return services.store().tokens.revoke(token_id)
