"""Outbound HTTP (dtask/worker/outbound.py, issue 35) against real receivers on 127.0.0.1: one
deadline over the whole call whatever the receiver does, no redirects, a bounded answer, and
private targets refused unless allowed, checked on the address the connection then goes to.
The address rules themselves (dtask/domain/notify.py) are checked without any network."""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dtask.domain.notify import check_url, refusal
from dtask.exceptions import DtaskError
from dtask.worker import outbound
from tests.support.db import wait_for
from tests.support.receivers import Flood, Plain, Redirector, Silent, Trickler

BODY = b'{"id": 1, "state": "succeeded"}'
HEADERS = {"Content-Type": "application/json"}
ALLOWED = "(DTASK_NOTIFY_ALLOW_PRIVATE)"


def post(url: str, **options: Any) -> tuple[str | None, float]:
    """What outbound.post answered, and how long it took."""
    start = time.monotonic()
    error = outbound.post(url, BODY, HEADERS, **options)
    return error, time.monotonic() - start


def test_a_trickled_answer_is_cut_at_the_deadline_over_the_whole_call() -> None:
    with Trickler(every=2.0) as trickler:
        error, took = post(trickler.url, deadline=5.0)
        assert error == "no complete answer within the 5 s deadline"
        assert 5.0 <= took < 6.5
        (connection,) = trickler.connections
        wait_for(lambda: connection.closed is not None, 5, "the hang-up seen by the trickler")
        assert connection.sent > 29  # every read got a byte in 2 s: a per-read timeout of 5 s
        # (urlopen's) would have waited for ever


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_silent_receiver_is_given_up_at_the_deadline(scheme: str) -> None:
    with Silent() as silent:  # over https: the TLS handshake never completes
        error, took = post(silent.url.replace("http:", f"{scheme}:"), deadline=2.0)
        assert error == "no complete answer within the 2 s deadline"
        assert 2.0 <= took < 3.5


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_try_and_is_not_followed(status: int) -> None:
    with Plain() as target, Redirector(target.url, status) as redirector:
        error, _ = post(redirector.url)
        assert error == f"HTTP {status} (redirects are not followed)"
        assert len(redirector.connections) == 1 and target.connections == []


@pytest.mark.parametrize(("status", "expected"), [(200, None), (500, "HTTP 500")])
def test_an_endless_body_is_read_up_to_its_bound_and_the_status_decides(
    status: int, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[int] = []
    readinto = outbound._Reader.readinto

    def counted(self: outbound._Reader, buffer: Any) -> int:
        n = readinto(self, buffer)
        got.append(n)
        return n

    monkeypatch.setattr(outbound._Reader, "readinto", counted)
    with Flood(status) as flood:
        error, took = post(flood.url, deadline=10.0)
        assert error == expected
        assert took < 5.0  # it stopped reading: the body never ends
        assert sum(got) <= 200 + outbound.MAX_BODY + 8192  # head, bound, one read's buffer
        (connection,) = flood.connections
        wait_for(lambda: connection.closed is not None, 30, "the flood cut off")


def test_an_endless_head_is_refused_at_its_bound() -> None:
    with Flood(200, in_headers=True) as flood:
        error, took = post(flood.url, deadline=10.0)
        assert error == f"the answer's status line and headers are over {outbound.MAX_HEAD} bytes"
        assert took < 5.0


def test_a_private_target_is_refused_unless_allowed() -> None:
    with Plain() as receiver:
        error, _ = post(receiver.url, allow_private=False)
        assert error == f"refused: 127.0.0.1 is a loopback address {ALLOWED}"
        named = receiver.url.replace("127.0.0.1", "localhost")
        error, _ = post(named, allow_private=False)
        assert error is not None and error.startswith("refused: localhost resolves to ")
        assert error.endswith(f", a loopback address {ALLOWED}")  # 127.0.0.1 or ::1
        assert receiver.connections == []  # refused before any connection

        assert post(receiver.url, allow_private=True)[0] is None
        (request,) = receiver.got
        assert request.startswith(b"POST /hook HTTP/1.1\r\n") and request.endswith(BODY)
    error, took = post("http://10.0.0.5:8080/hook", allow_private=False)
    assert error == f"refused: 10.0.0.5 is a private address {ALLOWED}" and took < 1.0
    error, _ = post("http://[::ffff:169.254.169.254]/latest/meta-data", allow_private=False)
    assert error == f"refused: ::ffff:a9fe:a9fe (169.254.169.254) is a link-local address {ALLOWED}"


def test_the_connection_goes_to_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A name looked up once: a second answer (DNS rebinding) is never asked for."""
    with Plain() as receiver:
        looked_up: list[str] = []

        def getaddrinfo(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
            looked_up.append(host)  # the receiver first, then what a rebinding DNS would say
            to = "127.0.0.1" if len(looked_up) == 1 else "10.255.255.1"
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (to, port))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        url = f"http://hooks.example.test:{receiver.port}/hook?x=1"
        assert post(url, allow_private=True)[0] is None
        assert looked_up == ["hooks.example.test"]
        (request,) = receiver.got
        assert f"\r\nHost: hooks.example.test:{receiver.port}\r\n".encode() in request
        assert request.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")


def test_a_hanging_lookup_counts_against_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(*args: Any, **kwargs: Any) -> list[Any]:
        time.sleep(30)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    error, took = post("http://slow-dns.example.test/hook", deadline=2.0)
    assert error == "no complete answer within the 2 s deadline" and 2.0 <= took < 3.0


def test_other_failures_are_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    for url in ("ftp://host/x", "file:///etc/passwd", "https:///no-host"):
        assert post(url)[0] == "refused: only http:// and https:// URLs with a host are called"
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    error, _ = post(f"http://127.0.0.1:{port}/hook")
    assert error is not None and error.startswith("ConnectionRefusedError:")
    with Plain(status=503) as receiver:
        assert post(receiver.url)[0] == "HTTP 503"

    def unknown(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    error, _ = post("http://no-such-host.example.test/hook")
    assert error == "OSError: cannot resolve the host: Name or service not known"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_https_checks_the_certificate_and_delivers_to_one_it_trusts(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = certificate
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    with Plain(tls=server) as receiver:
        error, _ = post(receiver.url)  # the system's trusted certificates only
        assert error == "TLS: CERTIFICATE_VERIFY_FAILED (self-signed certificate)"
        trusting = ssl.create_default_context(cafile=str(cert))
        monkeypatch.setattr(outbound, "_context", trusting)
        assert post(receiver.url)[0] is None
        assert len(receiver.got) == 1 and receiver.got[0].endswith(BODY)


def test_the_alert_webhook_may_be_private_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dtask.db.alerts import OpenAlert
    from dtask.worker import monitor

    alert = OpenAlert(7, "worker_lost", "w@host", "worker w@host stopped", datetime.now(UTC))
    with Plain() as receiver:
        monitor._post(receiver.url, "opened", alert)  # an operator's internal receiver
        assert len(receiver.got) == 1 and b'"event": "opened"' in receiver.got[0]
    monkeypatch.setattr(monitor, "WEBHOOK_DEADLINE", 1.0)
    with Trickler(every=0.5) as trickler, caplog.at_level(logging.WARNING, "dtask.alerts"):
        start = time.monotonic()
        monitor._post(trickler.url + "?token=s3cret", "opened", alert)
        took = time.monotonic() - start
        assert len(trickler.connections) == monitor.WEBHOOK_TRIES
        assert took < monitor.WEBHOOK_TRIES * 1.0 + 1.5 + 2.0  # tries, pauses, slack
    (line,) = caplog.messages
    assert line.endswith("not delivered to DTASK_ALERT_WEBHOOK: no complete answer within the 1 s"
                         " deadline")  # fmt: skip
    assert "s3cret" not in line and str(trickler.port) not in line


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("10.0.0.5", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"), ("fc00::1", "private"), ("127.0.0.1", "loopback"),
        ("::1", "loopback"), ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"), ("240.0.0.1", "reserved"), ("100.64.0.1", "non-global"),
    ],
)  # fmt: skip
def test_non_global_addresses_are_refused_naming_what_they_are(address: str, kind: str) -> None:
    why = refusal(ipaddress.ip_address(address))
    assert why is not None and why.startswith(f"{address} is a") and f" {kind} address " in why
    assert why.endswith(ALLOWED)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_global_addresses_are_not(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_a_literal_private_notify_url_is_refused_at_submit_when_not_allowed() -> None:
    for url in ("http://10.0.0.5/hook", "https://[::1]:8443/", "http://169.254.169.254/x"):
        assert check_url(url) == url  # allowed: the default of the pure check
        with pytest.raises(DtaskError, match=r"notify_url refused: .* address \(DTASK_NOTIFY"):
            check_url(url, allow_private=False)
    for url in ("https://hooks.example.com/dtask", "http://8.8.8.8/x", "http://internal/x"):
        assert check_url(url, allow_private=False) == url  # names are checked at delivery
