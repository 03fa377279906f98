"""API tokens: secrets are random and only their digest is kept; a token sees its own client."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from dtask.domain.tokens import PREFIX, Token, digest, new_secret, shown


def test_secrets_are_fresh_and_only_a_hint_of_them_is_shown() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100
    for secret in secrets:
        assert secret.startswith(PREFIX) and len(secret) >= 40
        assert len(digest(secret)) == 64 and secret not in digest(secret)
        assert secret.startswith(shown(secret).rstrip(".")) and len(shown(secret)) < 16


@given(own=st.sampled_from(["a", "b"]), other=st.sampled_from(["a", "b"]), admin=st.booleans())
def test_a_token_sees_its_own_client_and_an_admin_sees_all(
    own: str, other: str, admin: bool
) -> None:
    token = Token(1, own, admin, "dtk_xxxxxx...", datetime.now(UTC))
    assert token.sees(other) == (admin or own == other)
