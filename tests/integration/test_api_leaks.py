"""What an HTTP answer may show: never the database's URL (its user, host, name or a password
in its query), and a caller's text that is not UTF-8 escaped rather than a 500."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from dtask import services
from dtask.exceptions import DatabaseUnavailable
from tests.integration.test_api_guard import _ask

URL = "postgresql+psycopg://postgres@/dbname?host=/nonexistent-dtask-dir&password=S3CRET"


@pytest.fixture
def unreachable_database(
    dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    monkeypatch.setenv("DTASK_DATABASE_URL", URL)
    services.reset()
    yield
    monkeypatch.undo()
    services.reset()


def test_an_unreachable_database_is_not_named_in_the_answer(
    unreachable_database: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dtask.api"):
        status, body = asyncio.run(_ask("GET", "/api/v1/me", "anything"))
    assert status == 503, body
    assert body["error"] == "cannot reach the database (the server's log has the details)"
    for secret in ("S3CRET", "postgres", "dbname", "nonexistent-dtask-dir"):
        assert secret not in str(body)
    logged = caplog.text
    assert "cannot reach PostgreSQL at" in logged and "nonexistent-dtask-dir" in logged
    assert "S3CRET" not in logged and "password=***" in logged


def test_a_store_that_raises_database_unavailable_answers_503_without_detail(
    dtask_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, secret = services.store().tokens.create("default", admin=True)

    def down(*_: object, **__: object) -> None:
        raise DatabaseUnavailable("cannot reach PostgreSQL at postgresql://u@db.internal/x")

    monkeypatch.setattr(services.store().runs, "statuses", down)
    status, body = asyncio.run(_ask("GET", "/api/v1/runs", secret))
    assert status == 503, body
    assert "db.internal" not in str(body) and "postgresql" not in str(body)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/runs", b'{"template": "print_range", "variables": {"\\ud800": "a"}}'),
        (
            "PUT",
            "/api/v1/schedules/leaks",
            b'{"template": "print_range", "every": 60, "variables": {"\\ud800": "a"}}',
        ),
        ("POST", "/api/v1/runs", b'{"template": "\\ud800"}'),
    ],
)
def test_a_lone_surrogate_is_answered_escaped(
    dtask_env: dict[str, str], method: str, path: str, body: bytes
) -> None:
    _, secret = services.store().tokens.create("default", admin=True)
    status, answer = asyncio.run(_ask(method, path, secret, body))
    assert 400 <= status < 500, answer
    assert "\\ud800" in answer["error"], answer
