"""A /metrics server that behaves as a hostile (or broken) target may: run as its own process, so it is the target.

    python hostile_metrics.py MODE PORT [--metric NAME] [--bytes N] [--series N] [--to URL] [--progress FILE]

MODE:
  normal    a real prometheus_client histogram `--metric`, 20 observations a second
  drip      a valid answer, one byte a second, forever
  flood     headers, then `--bytes` of lines of a family nobody reads, no Content-Length, as fast as it goes
  announce  Content-Length of `--bytes`, then the same lines
  series    `--series` series of the histogram `--metric` itself
  redirect  302 to `--to`
  error     HTTP 503
  hold      listens and never accepts (a stopped server)
`--progress FILE` gets the bytes sent so far in the current answer, every 8 MiB (the tests time signals by it).
Generated answers are made line by line as they are sent: nothing of their size is ever held.
"""

from __future__ import annotations

import argparse
import random
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram, generate_latest

HOSTILE = Path(__file__).resolve()
METRIC = "test_request_latency_seconds"
_REPORT_EVERY = 8 << 20

# Another user's server, under the system Python (the venv need not be readable by that user): a valid answer,
# with made-up figures.
IMPOSTOR = f"""
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'# TYPE {METRIC} histogram\\n{METRIC}_bucket{{le="+Inf"}} 1e9\\n{METRIC}_count 1e9\\n{METRIC}_sum 1\\n'
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
"""


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Wait until something accepts connections on `port` (the server `proc` started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"hostile server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout} s")


def _request(conn: socket.socket) -> bool:
    """Read the request head; False if the client went away first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return False
        data += chunk
    return True


def _filler(total: int) -> Iterator[bytes]:
    line = b"".join(f'filler_metric{{shard="{i:04d}",pad="{"x" * 40}"}} 1\n'.encode() for i in range(1000))
    sent = 0
    while sent < total:
        block = line[:total - sent]
        sent += len(block)
        yield block


def _series(metric: str, count: int) -> Iterator[bytes]:
    yield f"# TYPE {metric} histogram\n".encode()
    for start in range(0, count, 1000):
        yield "".join(f'{metric}_bucket{{le="+Inf",series="{i}"}} 1\n'
                      for i in range(start, min(count, start + 1000))).encode()


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.registry = CollectorRegistry()
        self.hist = Histogram(args.metric, "request latency", buckets=(0.01, 0.05, 0.1, 0.5, 1.0),
                              registry=self.registry)

    def observe_forever(self) -> None:
        rng = random.Random(7)
        while True:
            self.hist.observe(rng.lognormvariate(-3.0, 0.5))
            time.sleep(0.05)

    def _progress(self, sent: int) -> None:
        if self.args.progress:
            with open(self.args.progress, "w") as fh:
                fh.write(str(sent))

    def _stream(self, conn: socket.socket, head: bytes, blocks: Iterator[bytes]) -> None:
        conn.sendall(head)
        sent, reported = 0, 0
        for block in blocks:
            conn.sendall(block)
            sent += len(block)
            if sent - reported >= _REPORT_EVERY:
                reported = sent
                self._progress(sent)
        self._progress(sent)

    def handle(self, conn: socket.socket) -> None:
        a = self.args
        with conn:
            try:
                if not _request(conn):
                    return
                if a.mode == "normal":
                    body = generate_latest(self.registry)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                elif a.mode == "drip":
                    body = generate_latest(self.registry)
                    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                    for i in range(len(answer)):
                        conn.sendall(answer[i:i + 1])
                        time.sleep(1.0)
                elif a.mode == "flood":
                    self._stream(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
                                 _filler(a.bytes))
                elif a.mode == "announce":
                    self._stream(conn, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % a.bytes, _filler(a.bytes))
                elif a.mode == "series":
                    self._stream(conn, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
                                 _series(a.metric, a.series))
                elif a.mode == "redirect":
                    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % a.to.encode())
                elif a.mode == "error":
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\noverloaded\n")
            except OSError:
                return  # the agent hung up (a cap, its deadline): what it is meant to do

    def serve(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.args.port))
        listener.listen(64)
        if self.args.mode == "hold":
            while True:
                time.sleep(60)
        threading.Thread(target=self.observe_forever, daemon=True).start()
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("normal", "drip", "flood", "announce", "series", "redirect", "error", "hold"))
    p.add_argument("port", type=int)
    p.add_argument("--metric", default=METRIC)
    p.add_argument("--bytes", type=int, default=1 << 30)
    p.add_argument("--series", type=int, default=1_000_000)
    p.add_argument("--to", default="http://127.0.0.1:1/metrics")
    p.add_argument("--progress")
    p.add_argument("--tag", help="ignored: lets a test find this process by its command line")
    Server(p.parse_args()).serve()


if __name__ == "__main__":
    main()
