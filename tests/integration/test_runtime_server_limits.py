"""What a slow client may hold, against a live `wok runtime serve --device sim` with short
limits: headers that do not arrive in time close the connection (a 408 first when part of a
request came), a body that does not arrive in time is a 408, and a client that keeps to the
limits is served on the same kept-alive connection."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
from runtime_harness import RuntimeServer, start_server

pytestmark = pytest.mark.integration

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(
        tmp_path_factory.mktemp("limits"),
        "--device", "sim", "--profile", "sim:llama-3-8b-80g", "--sim-load-seconds", "0",
        "--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S),
        kv_cache_bytes=None,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.log()


def connect(server: RuntimeServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_half_sent_headers_are_answered_408_and_closed(server: RuntimeServer):
    with connect(server) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answer = read_all(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert TIMEOUT_S * 0.9 < waited < TIMEOUT_S + 20  # closed by the limit, not by the test


def test_a_connection_that_sends_nothing_is_closed(server: RuntimeServer):
    with connect(server) as sock:
        assert read_all(sock) == b""


def test_a_half_sent_body_is_answered_408(server: RuntimeServer):
    with connect(server) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"prompt": '
        )
        answer = read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower(), answer
    assert b'"code":"request_timeout"' in body and b"--body-timeout" in body


def test_a_kept_alive_connection_still_serves_request_after_request(server: RuntimeServer):
    body = {"prompt": [1, 2, 3], "max_tokens": 2}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(3):
            assert http.post("/v1/completions", json=body).status_code == 200
            time.sleep(TIMEOUT_S * 0.6)  # idle between requests: the keep-alive timeout's


def test_a_body_over_the_limit_is_read_before_the_413(tmp_path: Path):
    """The 413 comes once the body is in (a client writing all of it before reading sees it),
    and a body that stops coming is a 408 even so."""
    server = start_server(
        tmp_path, "--device", "sim", "--profile", "sim:llama-3-8b-80g", "--sim-load-seconds",
        "0", "--max-request-bytes", "1000", "--body-timeout", str(TIMEOUT_S),
        kv_cache_bytes=None,
    )  # fmt: skip
    try:
        with connect(server) as sock:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
            sock.sendall(head + b"x" * 4000)
            answer = read_all(sock)  # the last 1000 bytes never come
        assert answer.startswith(b"HTTP/1.1 408 "), answer
    finally:
        assert server.stop() == 0, server.log()
