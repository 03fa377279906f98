"""Request bodies against a real `dtask serve` (issue 58, item 6): the token is checked before
a body is read (no token: 401, the body unread), a body over DTASK_API_MAX_BODY is a 413 from
its Content-Length or once a chunked one passes it, and hostile uploads leave the server small
and quick; a legitimate 1,000-run batch still goes through."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from collections.abc import Iterator

import psutil
import pytest

from tests.support.api import ServerProcess, call, start_server, token
from tests.support.db import run_count
from tests.support.uploads import Upload, upload

pytestmark = pytest.mark.acceptance

GIB = 1024**3
LIMIT = 4 * 1024 * 1024  # DTASK_API_MAX_BODY's default
GIVE_UP = 64 * 1024 * 1024  # a server still reading after this much is reading the body
MB = 1024 * 1024


@pytest.fixture(scope="module")
def served(
    dtask_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, str]]:
    server, base = start_server(dtask_env, tmp_path_factory.mktemp("bodies") / "serve.log")
    try:
        yield server, base
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api(served: tuple[ServerProcess, str]) -> str:
    return served[1]


@pytest.fixture(scope="module")
def secret(dtask_env: dict[str, str]) -> str:
    import dtask

    dtask.set_client("bodies")
    return token(dtask_env, "bodies")


def _refused_unread(reply: Upload, status: int) -> None:
    assert reply.status == status, f"no {status} before {reply.sent} bytes were sent: {reply}"
    assert reply.closed, "the connection stays open: the server would read the body to its end"
    assert reply.headers["content-type"] == "application/json"
    assert reply.seconds < 10, reply


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/runs"), ("POST", "/runs/batch"), ("PUT", "/schedules/nightly")],
)
def test_a_body_without_a_valid_token_is_refused_before_it_is_read(
    api: str, method: str, path: str, chunked: bool
) -> None:
    for secret, said in [(None, "a token is required"), ("dtk_forged", "not valid")]:
        reply = upload(api, method, path, secret, GIB, chunked, give_up_after=GIVE_UP)
        _refused_unread(reply, 401)
        assert said in reply.body["error"] and reply.headers["www-authenticate"] == "Bearer"
        assert reply.headers["x-content-type-options"] == "nosniff"


def test_every_route_with_data_refuses_a_body_without_a_token_before_reading_it(
    api: str,
) -> None:
    """Every route and method of the OpenAPI document, and paths it does not have; the
    document, its viewer and the dashboard stay open (they hold no data)."""
    with urllib.request.urlopen(f"{api}/openapi.json", timeout=60) as document:
        paths = json.loads(document.read())["paths"]
    routes = [
        (method.upper(), re.sub(r"\{[^}]+\}", "1", path))
        for path, methods in paths.items()
        for method in methods
    ]
    assert len(routes) >= 20 and ("GET", "/metrics") in routes
    root = api.removesuffix("/api/v1")
    for method, path in [*routes, ("POST", "/api/v1/nowhere"), ("DELETE", "/metrics")]:
        reply = upload(root, method, path, None, GIB, True, give_up_after=GIVE_UP)
        assert reply.status == 401 and reply.closed, (method, path, reply)
    for path in ["/api/v1/openapi.json", "/api/v1/docs", "/", "/app.js"]:
        with urllib.request.urlopen(root + path, timeout=60) as page:
            assert page.status == 200


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_a_413_read_no_further(
    api: str, secret: str, chunked: bool
) -> None:
    before = run_count()
    reply = upload(api, "POST", "/runs/batch", secret, GIB, chunked, give_up_after=GIVE_UP)
    _refused_unread(reply, 413)
    assert reply.body == {
        "error": f"the request's body is over DTASK_API_MAX_BODY ({LIMIT} bytes): send less"
        " (fewer runs a batch)"
    }
    if not chunked:  # refused from its head: no more than the socket buffers took
        assert reply.sent < 16 * MB, reply
    at = upload(api, "POST", "/runs", secret, LIMIT, chunked, give_up_after=LIMIT)
    assert at.status == 422, at  # read and parsed: not JSON
    over = upload(api, "POST", "/runs", secret, LIMIT + 1, chunked, give_up_after=LIMIT + 1)
    assert over.status == 413 and over.closed, over
    assert run_count() == before


def test_hostile_uploads_leave_the_server_small_and_quick(
    served: tuple[ServerProcess, str], secret: str
) -> None:
    server, api = served
    process = psutil.Process(server.proc.pid)
    kinds = [(None, False), (None, True), (secret, False), (secret, True)]
    for who, chunked in kinds:  # the first of each allocates what every later one reuses
        upload(api, "POST", "/runs/batch", who, GIB, chunked, give_up_after=GIVE_UP)
    baseline = process.memory_info().rss
    refused: list[int | None] = []
    stop = threading.Event()

    def hostile(who: str | None, chunked: bool) -> None:
        while not stop.is_set():
            reply = upload(api, "POST", "/runs/batch", who, GIB, chunked, give_up_after=GIVE_UP)
            refused.append(reply.status)

    threads = [threading.Thread(target=hostile, args=kind) for kind in kinds]
    for thread in threads:
        thread.start()
    latencies: list[float] = []
    peak = baseline
    try:
        deadline = time.monotonic() + 60
        while (len(refused) < 40 or len(latencies) < 20) and time.monotonic() < deadline:
            started = time.monotonic()
            me = call(api, "GET", "/me", secret)
            latencies.append(time.monotonic() - started)
            assert me.status == 200 and me.body["client"] == "bodies"
            peak = max(peak, process.memory_info().rss)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    median = sorted(latencies)[len(latencies) // 2]
    print(
        f"{len(refused)} uploads of 1 GB refused, {len(latencies)} GETs: slowest"
        f" {max(latencies) * 1000:.0f} ms, median {median * 1000:.0f} ms;"
        f" RSS {baseline / MB:.0f} MB -> peak {peak / MB:.0f} MB"
    )
    assert set(refused) <= {401, 413} and len(refused) >= 40, refused
    assert peak - baseline < 50 * MB
    assert max(latencies) < 2.0


def test_a_legitimate_1000_run_batch_goes_through(api: str, secret: str) -> None:
    stamp = f"bodies-{time.time()}"
    place = "s3://acme-data-exports/warehouse/orders/2024/06/30/part-{:05d}.snappy.parquet"
    runs = [
        {"variables": {"n": 10, "hold": f"{place.format(i)}#{'x' * 900}"}, "key": f"{stamp}-{i}"}
        for i in range(1000)
    ]
    body = {"template": "held_split", "runs": runs}
    weight = len(json.dumps(body))
    assert 1 * MB < weight < LIMIT  # a heavy one: runs of about 1 KB each
    before = run_count()
    reply = call(api, "POST", "/runs/batch", secret, body)
    assert reply.status == 200, reply.body
    assert reply.body["created"] == 1000 and run_count() == before + 1000
