"""The HTTP POST's safety: scheme check, bounded response, a dripping or silent server cannot hold it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agent.alerts.transport import MAX_RESPONSE_BYTES, post


@pytest.fixture
def raw_server():
    """A TCP server on loopback whose connection handler the test writes."""
    servers = []

    def make(handle) -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        servers.append(sock)

        def serve() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                threading.Thread(target=handle, args=(conn,), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{sock.getsockname()[1]}/hook"

    yield make
    for s in servers:
        s.close()


def read_request(conn: socket.socket) -> None:
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)


def test_only_http_and_https() -> None:
    result = post("ftp://127.0.0.1/x", b"{}", {}, timeout=1)
    assert result.status is None and result.error.startswith("refusing non-http(s) URL")


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc/h", "http://127.0.0.1:99999/h", "http://[::1/h"])
def test_an_unparseable_url_is_a_failed_attempt_not_an_exception(url: str) -> None:
    result = post(url, b"{}", {}, timeout=1, safe_url="http://127.0.0.1/h")
    assert result.status is None and result.error == "refusing unparseable URL http://127.0.0.1/h"


def test_huge_response_is_read_only_up_to_the_bound(raw_server) -> None:
    def handle(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
        try:
            conn.sendall(b"x" * 10_000_000)
        except OSError:
            pass
        conn.close()

    result = post(raw_server(handle), b"{}", {}, timeout=2)
    assert result.accepted and len(result.body) == MAX_RESPONSE_BYTES


def dripping(head: bytes, piece: bytes):
    """A handler that sends `head`, then `piece` every 0.3 s for 30 s: a body that never ends in time."""
    def handle(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(head)
        try:
            for _ in range(100):
                conn.sendall(piece)
                time.sleep(0.3)
        except OSError:
            pass
        conn.close()

    return handle


def test_dripping_server_is_cut_off(raw_server) -> None:
    handle = dripping(b"HTTP/1.1 500 Oops\r\nContent-Length: 1000\r\n\r\n", b"x")
    started = time.monotonic()
    result = post(raw_server(handle), b"{}", {}, timeout=0.5)
    assert time.monotonic() - started < 0.5 + 1.0
    assert result.status == 500 and result.retryable and not result.accepted


def test_chunked_body_cut_off_keeps_the_status(raw_server) -> None:
    handle = dripping(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n", b"1\r\nx\r\n")
    started = time.monotonic()
    result = post(raw_server(handle), b"{}", {}, timeout=0.5)
    assert time.monotonic() - started < 0.5 + 1.0
    assert result.status == 503 and result.body.startswith(b"x") and result.retryable


def test_server_dripping_its_headers_is_cut_off_at_the_timeout(raw_server) -> None:
    # Each byte comes well inside the socket timeout, so only a deadline over the whole attempt stops this.
    def handle(conn: socket.socket) -> None:
        read_request(conn)
        try:
            for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"x" * 200:
                conn.sendall(bytes([byte]))
                time.sleep(0.3)
        except OSError:
            pass
        conn.close()

    started = time.monotonic()
    result = post(raw_server(handle), b"{}", {}, timeout=0.5, safe_url="http://127.0.0.1/hook")
    took = time.monotonic() - started
    assert result.status is None and result.error == "timed out after 0.5 s talking to http://127.0.0.1/hook"
    assert 0.45 < took < 0.5 + 1.0, took


def test_silent_server_times_out(raw_server) -> None:
    def handle(conn: socket.socket) -> None:
        read_request(conn)
        time.sleep(5)
        conn.close()

    started = time.monotonic()
    result = post(raw_server(handle), b"{}", {}, timeout=0.5, safe_url="http://127.0.0.1/hook")
    assert time.monotonic() - started < 2
    assert result.status is None and result.error == "timed out after 0.5 s talking to http://127.0.0.1/hook"


def test_a_refusals_body_is_shown_as_one_printable_line(raw_server) -> None:
    """The excerpt of a refusal goes to `infersight alerts`, logs and the page: a receiver's answer cannot
    move the terminal's cursor, clear it, or start a new log line."""
    def handle(conn: socket.socket) -> None:
        conn.recv(65536)
        body = b"no\x1b[2J\x1b]0;owned\x07 way\r\nfake: log line" + "\u202e".encode()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        conn.close()

    result = post(raw_server(handle), b"{}", {}, timeout=5)
    assert result.status == 400
    assert result.error.startswith("HTTP 400 from http://127.0.0.1:")
    assert result.error.isprintable() and "way  fake: log line" in result.error
