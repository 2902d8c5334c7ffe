"""Hostile requests to the workload: every one gets a 4xx in one line, never a 500, a traceback or a stall."""

import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.workload


def _post(url: str, body: bytes, timeout: float = 30) -> tuple[int, bytes]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("body", [
    b'{"prompt": "\\ud800 lone surrogate", "max_tokens": 2}',
    b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    b'{"prompt": "x", "max_tokens": 1e400}',
])
def test_hostile_bodies_are_a_400(server, body):
    code, text = _post(server.url, body)
    assert code == 400, text
    assert b"Traceback" not in text and json.loads(text)["error"]["message"]


def test_a_huge_body_is_refused_before_it_is_read(server):
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 52428800\r\n\r\n")
        sock.sendall(b"{" + b" " * 65536)
        began = time.monotonic()
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - began < 5


def test_a_burst_gets_429_and_health_stays_up(server_factory):
    server = server_factory()  # the defaults: 32 HTTP threads, 64 waiting
    body = json.dumps({"prompt": "hello", "max_tokens": 48}).encode()
    codes: list[int] = []

    def one() -> None:
        try:
            codes.append(_post(server.url, body, timeout=120)[0])
        except OSError:
            codes.append(-1)

    threads = [threading.Thread(target=one) for _ in range(150)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
    began = time.monotonic()
    conn.request("GET", "/health")
    health = conn.getresponse()
    took = time.monotonic() - began
    conn.close()
    for t in threads:
        t.join(timeout=180)
    assert health.status == 200 and took < 2.0, f"/health took {took:.1f} s during the burst"
    assert codes.count(429) > 0 and -1 not in codes and set(codes) <= {200, 429}, sorted(set(codes))


def test_idle_connections_do_not_stall_health_or_metrics(server):
    # waitress's default of 100 connections let any local user's 100 idle sockets keep /health out for 120 s.
    parts = urlsplit(server.url)
    idle = [socket.create_connection((parts.hostname, parts.port)) for _ in range(150)]
    try:
        time.sleep(0.5)
        for path in ("/health", "/metrics"):
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
            began = time.monotonic()
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
            finally:
                conn.close()
            took = time.monotonic() - began
            assert resp.status == 200 and took < 1.0, f"{path}: {resp.status} after {took:.2f} s"
    finally:
        for sock in idle:
            sock.close()
