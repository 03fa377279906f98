"""API tokens: created for a client, found by the digest of a presented secret, revoked."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from dtask.db.database import Database, sql
from dtask.domain.tokens import Token, digest, new_secret, shown
from dtask.exceptions import TokenNotFound

_COLUMNS = "id, client, admin, hint, created_at, revoked_at"


def _token(row: Row[Any]) -> Token:
    return Token(row.id, row.client, row.admin, row.hint, row.created_at, row.revoked_at)


class TokenStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, client: str, admin: bool) -> tuple[Token, str]:
        """A new token for ``client`` and its secret (returned here only)."""
        secret = new_secret()
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "INSERT INTO dtask_tokens (client, admin, digest, hint)"
                    f" VALUES (:client, :admin, :digest, :hint) RETURNING {_COLUMNS}"
                ),
                {"client": client, "admin": admin, "digest": digest(secret), "hint": shown(secret)},
            ).one()
        return _token(row), secret

    def find(self, secret: str) -> Token | None:
        """The live token whose secret this is, if any."""
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    f"SELECT {_COLUMNS} FROM dtask_tokens"
                    " WHERE digest = :digest AND revoked_at IS NULL"
                ),
                {"digest": digest(secret)},
            ).first()
        return None if row is None else _token(row)

    def all(self) -> list[Token]:
        with self.db.tx() as conn:
            rows = conn.execute(sql(f"SELECT {_COLUMNS} FROM dtask_tokens ORDER BY id")).all()
        return [_token(r) for r in rows]

    def revoke(self, token_id: int) -> Token:
        with self.db.tx() as conn:
            row = conn.execute(
                sql(
                    "UPDATE dtask_tokens SET revoked_at = coalesce(revoked_at, now())"
                    f" WHERE id = :id RETURNING {_COLUMNS}"
                ),
                {"id": token_id},
            ).first()
        if row is None:
            raise TokenNotFound(f"no token with id {token_id} (see `dtask token list`)")
        return _token(row)
