"""One bounded GET of a Prometheus text endpoint: one deadline, a byte cap, a series cap, no redirects.

The answer is the watched process's to write, so it is read as untrusted input, the way Prometheus reads a scrape
target (`scrape_timeout`, `body_size_limit`, `sample_limit`): the whole exchange — connect, headers, body, and the
parse after it — has one deadline, checked before every receive (a target that drips a byte a second is cut off
at the deadline, not at a per-receive timeout it can reset forever); the answer is streamed and filtered as it
arrives, keeping only the lines of the families read, so neither a 1 GiB answer nor a million series is ever held
in memory; a redirect is an answer, never followed (root must not be sent to fetch another address).
"""

from __future__ import annotations

import base64
import functools
import http.client
import io
import re
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from analysis.errors import NoAnswer, ReadingError
from analysis.redact import redact_text, redact_url

# Defaults of the config keys (docs/config.md says why these values).
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_SERIES = 10_000
# A line of a family we read is a sample of ~100 bytes (name, a few labels, a value); a longer one is refused,
# since the parser's cost grows with it. Lines of other families are skipped whatever their length.
MAX_LINE_BYTES = 4096
_CHUNK = 64 << 10
# How many family names a "metric not found" error lists.
_EXPOSED_SHOWN = 8
_TYPE_LINE = re.compile(rb"^#[ \t]+TYPE[ \t]+(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Limits:
    """What one scrape may take: seconds for the whole exchange, bytes of answer (headers and body), and lines of
    the families read."""

    deadline_seconds: float
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_series: int = DEFAULT_MAX_SERIES

    def __post_init__(self) -> None:
        if not 0 < self.deadline_seconds <= 60:
            raise ValueError(f"deadline_seconds must be within (0, 60], got {self.deadline_seconds!r}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be at least 1024, got {self.max_body_bytes!r}")
        if self.max_series < 1:
            raise ValueError(f"max_series must be at least 1, got {self.max_series!r}")


@dataclass(frozen=True)
class Scraped:
    """What is kept of one answer: the lines of the families read, and what the answer was like."""

    text: str
    body_bytes: int
    series: int
    # The first family names the answer declared (# TYPE), for an error that says what the endpoint does expose.
    exposed: tuple[str, ...] = ()


class LineFilter:
    """Keeps, from exposition text fed in chunks, the lines of families whose names start with `prefixes` (their
    samples and their # HELP/# TYPE lines); refuses more than `max_series` of them or one over MAX_LINE_BYTES.
    `prefixes=None` keeps every line (no series cap)."""

    def __init__(self, prefixes: tuple[str, ...] | None, max_series: int, what: str = "the answer") -> None:
        self._keep_all = prefixes is None
        names = b"|".join(re.escape(p.encode()) for p in prefixes or ())
        # Whole lines only: a sample line starts with the name, a comment line has it as its third word.
        self._keep = re.compile(rb"^(?:#[ \t]+\S+[ \t]+)?(?:" + names + rb")[^\r\n]*", re.MULTILINE)
        self._max_series = max_series
        self._what = what
        self._kept: list[bytes] = []
        self._carry = bytearray()
        self._skipping = False
        self.series = 0
        self.exposed: list[str] = []

    def feed(self, chunk: bytes) -> None:
        end = chunk.rfind(b"\n")
        if end < 0:
            self._extend(chunk)
            return
        first = chunk.find(b"\n")
        self._extend(chunk[:first])
        if not self._skipping:
            self._lines(bytes(self._carry))
        self._carry.clear()
        self._skipping = False
        self._lines(chunk[first + 1:end])
        self._extend(chunk[end + 1:])

    def finish(self) -> str:
        if self._carry and not self._skipping:
            self._lines(bytes(self._carry))
        self._carry.clear()
        self._kept.append(b"")
        return b"\n".join(self._kept).decode("utf-8", errors="replace")

    def _extend(self, data: bytes) -> None:
        """A line that has not ended yet: held until it does, unless it is long and not one we keep."""
        if self._skipping or not data:
            return
        self._carry += data
        if len(self._carry) > MAX_LINE_BYTES and not self._keep_all:
            if self._keep.match(self._carry):
                self._refuse_line(bytes(self._carry))
            self._skipping = True
            self._carry.clear()

    def _lines(self, block: bytes) -> None:
        """Complete lines, newline-separated."""
        if len(self.exposed) < _EXPOSED_SHOWN:
            for m in _TYPE_LINE.finditer(block):
                self.exposed.append(m.group(1).decode("utf-8", errors="replace"))
                if len(self.exposed) >= _EXPOSED_SHOWN:
                    break
        if self._keep_all:
            self._kept.append(block)
            return
        for m in self._keep.finditer(block):
            line = m.group()
            if len(line) > MAX_LINE_BYTES:
                self._refuse_line(line)
            if not line.startswith(b"#"):
                self.series += 1
                if self.series > self._max_series:
                    raise ReadingError(f"{self._what} holds more than {self._max_series} series of the families "
                                       f"read (max_series); refused")
            self._kept.append(line)

    def _refuse_line(self, line: bytes) -> None:
        name = re.split(rb"[{\s]", line[:200], maxsplit=1)[0].decode("utf-8", errors="replace")
        raise ReadingError(f"{self._what} has a line of {name!r} longer than {MAX_LINE_BYTES} bytes; refused")


def filter_text(text: str, prefixes: tuple[str, ...] | None, max_series: int = DEFAULT_MAX_SERIES) -> Scraped:
    """LineFilter over text already in memory (an injected fetch, tests)."""
    data = text.encode("utf-8", errors="replace")
    lines = LineFilter(prefixes, max_series)
    lines.feed(data)
    return Scraped(text=lines.finish(), body_bytes=len(data), series=lines.series, exposed=tuple(lines.exposed))


def deadline_lines(text: str, deadline: float, what: str) -> Iterator[str]:
    """`text`'s lines for the parser, stopping it with a ReadingError once `deadline` (monotonic) passes: parsing
    is part of the scrape's time."""
    for i, line in enumerate(io.StringIO(text)):
        if i % 256 == 0 and time.monotonic() > deadline:
            raise ReadingError(f"{what}: parsing the families read took longer than the scrape's deadline")
        yield line


class _Over(Exception):
    """The answer went past max_body_bytes."""


class _DeadlineReader(io.RawIOBase):
    """The socket as http.client reads it: every receive waits at most until the exchange's deadline, and counts
    toward its byte cap."""

    def __init__(self, sock: socket.socket, exchange: Exchange) -> None:
        super().__init__()
        self._sock, self._exchange = sock, exchange

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        ex = self._exchange
        remaining = ex.deadline - time.monotonic()
        if remaining <= 0 or ex.aborted:
            raise TimeoutError("timed out")
        self._sock.settimeout(remaining)
        view = memoryview(buffer)
        # One byte past the cap at most: enough to know the answer is over it, never more than that read.
        n = self._sock.recv_into(view[:min(len(view), ex.limits.max_body_bytes - ex.received + 1)])
        ex.received += n
        if ex.received > ex.limits.max_body_bytes:
            raise _Over()
        return n


class _Socket:
    """What http.client.HTTPResponse wants of a socket: makefile(), here over the deadline reader."""

    def __init__(self, sock: socket.socket, exchange: Exchange) -> None:
        self._sock, self._exchange = sock, exchange

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._exchange), _CHUNK)


class _KeepSocket:
    """getresponse() closes the connection's socket when the answer ends with the connection (always, here: we
    ask for that), and hands it to the response through makefile(); ours does not count that reference, so the
    socket is left to the Exchange to close once the body is read."""

    sock: socket.socket | None

    def close(self) -> None:
        self.sock = None
        super().close()  # type: ignore[misc]


class _HTTP(_KeepSocket, http.client.HTTPConnection):
    pass


class _HTTPS(_KeepSocket, http.client.HTTPSConnection):
    pass


@functools.cache
def _tls() -> ssl.SSLContext:
    # Loading the system's CA certificates costs milliseconds: once per agent, not once per scrape.
    return ssl.create_default_context()


def _connection(parts, exchange: Exchange) -> http.client.HTTPConnection:
    timeout = max(0.001, exchange.deadline - time.monotonic())
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _HTTPS(parts.hostname, parts.port, timeout=timeout, context=_tls())
    else:
        conn = _HTTP(parts.hostname, parts.port, timeout=timeout)
    # getresponse() builds the response over this, instead of over the bare socket.
    conn.response_class = lambda sock, method=None: http.client.HTTPResponse(  # type: ignore[assignment]
        _Socket(sock, exchange), method=method)
    return conn


class Exchange:
    """One GET of `url` within `limits`, keeping the lines of the families named by `prefixes` (None: all).

    `run()` does it on the calling thread; `abort()`, from any other, ends it at once (the socket is shut down,
    so a receive in progress returns). `stage` says how far it got: "connect" until a connection is made, then
    "response"; `received` counts the answer's bytes so far. The deadline starts when the Exchange is made."""

    def __init__(self, url: str, limits: Limits, prefixes: tuple[str, ...] | None,
                 accept: str = "text/plain;version=0.0.4") -> None:
        self.url, self.limits, self.prefixes, self.accept = url, limits, prefixes, accept
        self.deadline = time.monotonic() + limits.deadline_seconds
        self.stage = "connect"
        self.received = 0
        self.aborted = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            sock = self._sock
        if sock is not None:
            try:
                # socket.socket's own shutdown, also under TLS: SSLSocket.shutdown would drop the SSL object
                # under the receive in progress on the other thread.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the exchange itself: nothing is left to stop

    def run(self) -> Scraped:
        shown = redact_url(self.url)
        where = f"latency endpoint {shown}"
        try:
            parts = urlsplit(self.url)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            _ = parts.port
        except ValueError as exc:
            raise ReadingError(f"{where} unusable: {redact_text(str(exc))}") from exc
        conn = _connection(parts, self)
        try:
            return self._exchange(conn, parts, path, where)
        finally:
            conn.close()
            with self._lock:
                sock, self._sock = self._sock, None
            if sock is not None:
                sock.close()

    def _exchange(self, conn: http.client.HTTPConnection, parts, path: str, where: str) -> Scraped:
        headers = {"Accept": self.accept, "User-Agent": "infersight", "Connection": "close"}
        if parts.username is not None:
            # What Prometheus's basic_auth sends; the URL's userinfo is never shown (analysis/redact.py).
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        try:
            conn.connect()
        except OSError as exc:
            if self.aborted:
                raise NoAnswer(f"{where} unreachable: no connection within {self.limits.deadline_seconds:g} s",
                               stage="connect") from exc
            raise NoAnswer(f"{where} unreachable: {redact_text(str(exc)) or type(exc).__name__}",
                           stage="connect") from exc
        with self._lock:
            self._sock = conn.sock
            aborted = self.aborted
        self.stage = "response"
        if aborted:
            raise NoAnswer(f"{where} did not answer: timed out, 0 bytes in {self.limits.deadline_seconds:g} s")
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            self._check_status(resp, where)
            lines = LineFilter(self.prefixes, self.limits.max_series, what=f"{where}'s answer")
            body = 0
            while chunk := resp.read(_CHUNK):
                body += len(chunk)
                lines.feed(chunk)
            text = lines.finish()
        except TimeoutError as exc:
            raise NoAnswer(f"{where} did not answer: timed out, {self.received} bytes in "
                           f"{self.limits.deadline_seconds:g} s (the whole answer must arrive within the "
                           f"deadline)") from exc
        except _Over as exc:
            raise ReadingError(f"{where} answered more than {self.limits.max_body_bytes} bytes "
                               f"(max_body_bytes); refused after reading {self.received}") from exc
        except http.client.IncompleteRead as exc:
            raise ReadingError(f"{where} cut its answer short: {len(exc.partial)} bytes of the body, "
                               f"{exc.expected} more announced") from exc
        except http.client.HTTPException as exc:
            # It answered, but not HTTP: a wrong answer, which must not end the tick.
            raise ReadingError(f"{where} answered something that is not HTTP: "
                               f"{type(exc).__name__} {redact_text(str(exc))[:80]!r}") from exc
        except OSError as exc:
            if self.aborted:
                raise NoAnswer(f"{where} did not answer: timed out, {self.received} bytes in "
                               f"{self.limits.deadline_seconds:g} s") from exc
            raise NoAnswer(f"{where} did not answer: {redact_text(str(exc)) or type(exc).__name__}") from exc
        return Scraped(text=text, body_bytes=body, series=lines.series, exposed=tuple(lines.exposed))

    def _check_status(self, resp: http.client.HTTPResponse, where: str) -> None:
        if 300 <= resp.status < 400:
            location = redact_url(resp.getheader("Location") or "")[:120]
            raise ReadingError(f"{where} answered HTTP {resp.status}, a redirect to {location!r}, which is not "
                               f"followed: set the url to where the metrics are")
        if not 200 <= resp.status < 300:
            raise ReadingError(f"{where} answered HTTP {resp.status}")
        encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise ReadingError(f"{where} answered with Content-Encoding {encoding[:40]!r}, not asked for")
        if resp.length is not None and resp.length > self.limits.max_body_bytes:
            raise _Over()
