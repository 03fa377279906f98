"""API tokens: a client's key to the HTTP API. The secret is shown once; PostgreSQL keeps only
its SHA-256 (a 256-bit random secret needs no slow hash: there is nothing to guess)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

PREFIX = "dtk_"


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def shown(secret: str) -> str:
    """What lists show of a secret: enough to tell tokens apart, never enough to use one."""
    return secret[: len(PREFIX) + 6] + "..."


@dataclass(frozen=True)
class Token:
    id: int
    client: str
    admin: bool
    hint: str  # the secret's first characters
    created_at: datetime
    revoked_at: datetime | None = None

    def sees(self, client: str) -> bool:
        """Whether this token may see and act on the runs of ``client``."""
        return self.admin or client == self.client

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "client": self.client,
            "admin": self.admin,
            "hint": self.hint,
            "created_at": self.created_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }
