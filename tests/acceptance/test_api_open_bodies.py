"""Bodies where none is due, and bodies that never end, against a real `dtask serve`: a path
that needs no token (the dashboard, the OpenAPI document and its viewer) takes no body, so one
announced is refused from the head, before a byte of it is read; an authenticated body that
has not all arrived within DTASK_API_BODY_TIMEOUT is cut with 408 and the connection closed."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.api import ServerProcess, start_server, token
from tests.support.uploads import trickle, upload

pytestmark = pytest.mark.acceptance

GIB = 1024**3
MB = 1024 * 1024
DEADLINE = 3  # DTASK_API_BODY_TIMEOUT of this module's server, in seconds
OPEN = ["/", "/app.js", "/api/v1/openapi.json", "/api/v1/docs", "/nowhere"]


@pytest.fixture(scope="module")
def root(dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = {**dtask_env, "DTASK_API_BODY_TIMEOUT": str(DEADLINE)}
    server: ServerProcess
    server, base = start_server(env, tmp_path_factory.mktemp("open") / "serve.log")
    try:
        yield base.removesuffix("/api/v1")
    finally:
        server.stop()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", OPEN)
def test_an_open_path_refuses_a_body_from_the_head(root: str, path: str, chunked: bool) -> None:
    """Only the head is sent (a body of 1,000 bytes announced, under DTASK_API_MAX_BODY, or a
    chunked one): the answer cannot wait for a byte of the body, it comes at once."""
    reply = upload(root, "POST", path, None, 1000, chunked, give_up_after=0)
    assert reply.status == 413, f"no answer to the head alone: the body is awaited: {reply}"
    assert reply.sent == 0 and reply.closed, reply
    assert reply.headers["content-type"] == "application/json"
    assert reply.body == {"error": "this path takes no request body: send none"}


def test_an_anonymous_gigabyte_to_the_dashboard_is_refused_unread(root: str) -> None:
    reply = upload(root, "POST", "/", None, GIB, True, give_up_after=64 * MB)
    assert reply.status == 413 and reply.closed, reply
    assert reply.seconds < 5, reply
    # What the kernel's socket buffers took before the answer came, never what was read.
    assert reply.sent < 16 * MB, reply


def test_the_open_paths_still_answer_without_a_body(root: str) -> None:
    for path in ["/", "/app.js", "/api/v1/openapi.json", "/api/v1/docs"]:
        with urllib.request.urlopen(root + path, timeout=60) as page:
            assert page.status == 200, path
    empty = urllib.request.Request(root + "/", data=b"", method="GET")  # Content-Length: 0
    with urllib.request.urlopen(empty, timeout=60) as page:
        assert page.status == 200


def test_a_trickled_body_with_a_token_is_cut_with_408(root: str, dtask_env: dict[str, str]) -> None:
    import dtask

    dtask.set_client("trickle")
    secret = token(dtask_env, "trickle")
    reply = trickle(root + "/api/v1", "/runs", secret, 1000, every=0.5, give_up=6 * DEADLINE)
    assert reply.status == 408, f"still reading a trickle after {reply.seconds:.1f} s: {reply}"
    assert DEADLINE - 0.5 < reply.seconds < DEADLINE + 3, reply
    assert reply.closed, reply
    assert reply.body == {
        "error": f"the request's body did not arrive within DTASK_API_BODY_TIMEOUT ({DEADLINE} s)"
    }
