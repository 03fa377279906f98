"""A real `dtask serve` process and small JSON calls against it, for the API and browser
tests."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import DTASK, REPO, DtaskProcess
from tests.support.ports import free_port


class ServerProcess(DtaskProcess):
    ready_marker = "Uvicorn running on"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


def call(
    base: str,
    method: str,
    path: str,
    token: str | None,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
            return Reply(response.status, dict(response.headers), json.loads(raw) if raw else None)
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, dict(exc.headers), json.loads(exc.read()))


def call_raw(base: str, path: str, token: str, body: str) -> Reply:
    """A POST of ``body`` as it is (JSON that ``json.dumps`` would not make)."""
    request = urllib.request.Request(base + path, data=body.encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return Reply(response.status, dict(response.headers), json.loads(response.read()))
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, dict(exc.headers), json.loads(exc.read()))


def token(env: dict[str, str], client: str, *flags: str) -> str:
    made = subprocess.run(
        [DTASK, "token", "create", "--client", client, *flags],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "shown once" in made.stderr
    return made.stdout.strip()


def start_server(env: dict[str, str], log: Path) -> tuple[ServerProcess, str]:
    port = free_port()  # not 8000: the README's test runs `dtask up` there
    server = ServerProcess(env, log, "serve", "--port", str(port))
    server.wait_ready()
    return server, f"http://127.0.0.1:{port}/api/v1"


class Receiver:
    """A local HTTP listener for webhooks: 200 to every POST (500 to the first if
    ``fail_first``)."""

    def __init__(self, fail_first: bool = False) -> None:
        import http.server
        import threading

        self.got: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.got.append((dict(self.headers), body))
                self.send_response(500 if fail_first and len(receiver.got) == 1 else 200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/done"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
