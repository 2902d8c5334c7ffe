"""One HTTP POST with the safety a root daemon needs: http/https only, no redirects, timeouts, bounded reads."""

from __future__ import annotations

import http.client
import ssl
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
    """POST body to url. Never raises for network trouble: the error is a one-line string that names the
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
    deadline = started + timeout * 2
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json",
                                                        "User-Agent": USER_AGENT, **headers})
        resp = conn.getresponse()
        data = b""
        # A receiver that drips bytes cannot hold the thread past the deadline nor fill memory.
        while len(data) < max_response_bytes and time.monotonic() < deadline:
            chunk = resp.read1(min(8192, max_response_bytes - len(data)))
            if not chunk:
                break
            data += chunk
        elapsed = time.monotonic() - started
        if 300 <= resp.status < 400:
            return PostResult(resp.status, f"HTTP {resp.status} redirect from {shown} not followed", data, elapsed)
        if not 200 <= resp.status < 300:
            excerpt = data[:200].decode("utf-8", "replace").replace("\n", " ").strip()
            return PostResult(resp.status, f"HTTP {resp.status} from {shown}" + (f": {excerpt}" if excerpt else ""),
                              data, elapsed)
        return PostResult(resp.status, None, data, elapsed)
    except TimeoutError:
        return PostResult(None, f"timed out after {timeout:g} s talking to {shown}", seconds=time.monotonic() - started)
    except ConnectionRefusedError:
        return PostResult(None, f"connection refused by {shown}", seconds=time.monotonic() - started)
    except ssl.SSLError as exc:
        return PostResult(None, f"TLS error with {shown}: {exc.reason or exc}", seconds=time.monotonic() - started)
    except (OSError, http.client.HTTPException) as exc:
        what = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return PostResult(None, f"cannot reach {shown}: {what}", seconds=time.monotonic() - started)
    finally:
        conn.close()
