"""One HTTP POST with the safety a root daemon needs: http/https only, no redirects, one deadline, bounded reads."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_RESPONSE_BYTES = 65536
USER_AGENT = "infersight-alerts/1"


@dataclass(frozen=True)
class PostResult:
    """What the receiver answered: an HTTP status, or the transport error that stopped the attempt."""

    status: int | None
    error: str | None
    body: bytes = b""
    seconds: float = 0.0

    @property
    def accepted(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """Worth another attempt later: no answer, a server error, or 408/425/429 (come back later)."""
        return self.status is None or self.status >= 500 or self.status in (408, 425, 429)


def post(url: str, body: bytes, headers: dict[str, str], *, timeout: float,
         max_response_bytes: int = MAX_RESPONSE_BYTES, safe_url: str | None = None) -> PostResult:
    """POST body to url; connect, send, response headers and body together take at most `timeout` (name
    resolution aside). Never raises for network trouble: the error is a one-line string that names the
    receiver by `safe_url` (no credentials, no query)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return PostResult(None, f"refusing unparseable URL {safe_url or ''}".rstrip())
    shown = safe_url or f"{parts.scheme}://{parts.hostname}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return PostResult(None, f"refusing non-http(s) URL {shown}")
    started = time.monotonic()
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    cutoff = _Cutoff(conn, timeout)
    try:
        conn.connect()
        if cutoff.fired:
            raise TimeoutError
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                        "User-Agent": USER_AGENT, **headers})
        resp = conn.getresponse()
        data = b""
        try:
            while len(data) < max_response_bytes:
                chunk = resp.read1(min(8192, max_response_bytes - len(data)))
                if not chunk:
                    break
                data += chunk
        except (OSError, http.client.HTTPException):
            # Cut off in the body: the status line already came and is the receiver's answer.
            if not cutoff.fired:
                raise
    except (OSError, http.client.HTTPException) as exc:
        return PostResult(None, _describe(exc, shown, timeout, cutoff.fired), seconds=time.monotonic() - started)
    finally:
        cutoff.cancel()
        conn.close()
    elapsed = time.monotonic() - started
    if 300 <= resp.status < 400:
        return PostResult(resp.status, f"HTTP {resp.status} redirect from {shown} not followed", data, elapsed)
    if not 200 <= resp.status < 300:
        # Shown by `infersight alerts`, in logs and on the page: one line, no terminal escapes from the receiver.
        excerpt = "".join(c if c.isprintable() else " " for c in data[:200].decode("utf-8", "replace")).strip()
        return PostResult(resp.status, f"HTTP {resp.status} from {shown}" + (f": {excerpt}" if excerpt else ""),
                          data, elapsed)
    return PostResult(resp.status, None, data, elapsed)


def _describe(exc: OSError | http.client.HTTPException, shown: str, timeout: float, cut: bool) -> str:
    if cut or isinstance(exc, TimeoutError):
        return f"timed out after {timeout:g} s talking to {shown}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {shown}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error with {shown}: {exc.reason or exc}"
    what = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    return f"cannot reach {shown}: {what}"


class _Cutoff:
    """Ends an attempt `seconds` after it began by shutting its socket down, which wakes whatever read or write
    is blocked. The socket timeout alone bounds each read, not the attempt: a receiver that drips a byte of its
    headers or body just inside it would hold the delivery thread for as long as it likes."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._done = False
        # Read by post() after connect: a cutoff that came while connecting found no socket to shut down.
        self.fired = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.fired = True
            sock = self._conn.sock
            if sock is None:
                return
            try:
                # The plain socket's shutdown even for TLS: SSLSocket.shutdown also drops the TLS state that the
                # blocked thread is reading through.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # ENOTCONN: the receiver hung up first, so nothing is blocked on this socket

    def cancel(self) -> None:
        """After this returns the socket is ours to close: no cut is under way or still to come."""
        with self._lock:
            self._done = True
        self._timer.cancel()
