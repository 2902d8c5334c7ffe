"""LatencySource against real HTTP servers exposing a real prometheus_client Histogram."""

from __future__ import annotations

import http.server
import math
import socket
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from agent.sources.latency import LatencySource, histogram_quantile
from analysis.errors import NoAnswer, ReadingError

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A colon, as in vLLM's names (the bundled workload exports those).
METRIC = "test:request_latency_seconds"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A real /metrics endpoint with one labelled Histogram; restart() forgets all counts."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._httpd = None
        self.start()

    def start(self) -> None:
        self.registry = CollectorRegistry()
        self.hist = Histogram(METRIC, "request latency", ["route"], buckets=BUCKETS, registry=self.registry)
        # Triton's shape: cumulative duration in microseconds plus a request counter, per model.
        self.duration_us = Counter("nv_inference_request_duration_us", "duration", ["model"], registry=self.registry)
        self.success = Counter("nv_inference_request_success", "requests", ["model"], registry=self.registry)
        self._httpd, self._thread = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server(free_port())
    yield srv
    srv.stop()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bucket_bounds(value: float) -> tuple[float, float]:
    lower = 0.0
    for upper in (*BUCKETS, math.inf):
        if value <= upper:
            return lower, upper
        lower = upper
    raise AssertionError("unreachable")


def observe(server: Server, values: np.ndarray, routes=("generate", "embed")) -> None:
    for i, v in enumerate(values):
        server.hist.labels(route=routes[i % len(routes)]).observe(float(v))


def test_quantiles_of_the_delta_match_numpy_within_bucket(server: Server) -> None:
    rng = np.random.default_rng(7)
    clock = FakeClock()
    src = LatencySource(server.url, METRIC, timeout=2.0, clock=clock)
    observe(server, rng.lognormal(np.log(0.02), 0.5, 500))  # before the baseline: must not count
    first = src.read()
    assert first.requests == 0 and first.p50_seconds is None

    values = rng.lognormal(np.log(0.08), 0.9, 2000)
    observe(server, values)
    clock.now += 5.0
    reading = src.read()
    assert reading.requests == len(values)
    assert reading.request_rate == pytest.approx(len(values) / 5.0)
    for q, got in ((50, reading.p50_seconds), (95, reading.p95_seconds), (99, reading.p99_seconds)):
        truth = float(np.percentile(values, q))
        lo, hi = bucket_bounds(truth)
        hi = min(hi, BUCKETS[-1])  # PromQL caps at the largest finite bound
        assert lo <= got <= hi, f"p{q}: estimate {got} outside truth {truth}'s bucket [{lo}, {hi}]"


def test_interpolation_equals_promql_by_hand(server: Server) -> None:
    src = LatencySource(server.url, METRIC)
    src.prime()
    # 10 in (0.05, 0.1], 10 in (0.1, 0.25]: p50 is the top of the first, p95 is 90% into the second.
    observe(server, np.array([0.07] * 10 + [0.2] * 10))
    reading = src.read()
    assert reading.p50_seconds == pytest.approx(0.1)
    assert reading.p95_seconds == pytest.approx(0.1 + 0.15 * 0.9)
    assert reading.p99_seconds == pytest.approx(0.1 + 0.15 * 0.98)


def test_window_without_requests_has_no_quantiles(server: Server) -> None:
    src = LatencySource(server.url, METRIC)
    observe(server, np.array([0.1]))
    src.prime()
    reading = src.read()
    assert reading.requests == 0 and reading.p99_seconds is None and reading.request_rate == 0.0


def test_counter_reset_takes_the_new_values_as_the_delta(server: Server) -> None:
    src = LatencySource(server.url, METRIC)
    observe(server, np.full(300, 0.3))
    src.prime()
    observe(server, np.full(100, 0.3))
    server.restart()
    observe(server, np.full(40, 0.008))  # fewer than before the restart: a reset
    reading = src.read()
    assert reading.requests == 40
    assert 0.005 <= reading.p99_seconds <= 0.01
    assert src.health().detail["counter_resets"] >= 1


def test_unreachable_server_is_a_counted_reading_error() -> None:
    port = free_port()
    src = LatencySource(f"http://127.0.0.1:{port}/metrics", METRIC, timeout=1.0)
    for _ in range(2):
        # No answer at all: news about the server (stopped, cut off), which the detector may read as a stall.
        with pytest.raises(NoAnswer, match=f"127.0.0.1:{port}.*unreachable") as raised:
            src.read()
        assert raised.value.stage == "connect"  # refused: nothing listens there
    health = src.health()
    assert health.state == "failed" and health.error_count == 2 and "unreachable" in health.reason


def test_a_server_that_accepts_but_never_answers_is_no_answer_within_the_timeout() -> None:
    # What a SIGSTOPped server looks like from outside: the kernel still completes the TCP handshake into the
    # listen backlog, and nothing ever replies.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        src = LatencySource(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", METRIC, timeout=0.5)
        with pytest.raises(NoAnswer, match="did not answer: .*timed out") as raised:
            src.read()
        # It connected: the port was reached and the server did not reply, which is not the network's doing.
        assert raised.value.stage == "response"


def test_an_endpoint_that_answers_something_not_http_is_a_reading_error_not_an_escape() -> None:
    # http.client raises BadStatusLine, which is no OSError: it used to leave the source and fail the whole tick,
    # losing every target's window.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)

        def garbage() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"garbage\r\n\r\n")

        threading.Thread(target=garbage, daemon=True).start()
        src = LatencySource(f"http://127.0.0.1:{listener.getsockname()[1]}/metrics", METRIC, timeout=2.0)
        with pytest.raises(ReadingError, match="not HTTP: BadStatusLine") as raised:
            src.read()
        assert not isinstance(raised.value, NoAnswer)


def test_missing_metric_names_it_and_recovers(server: Server) -> None:
    src = LatencySource(server.url, "no_such_latency_seconds")
    with pytest.raises(ReadingError, match="'no_such_latency_seconds' not found.*test:request_latency_seconds"):
        src.read()
    assert src.health().error_count == 1
    good = LatencySource(server.url, METRIC)
    good.prime()
    assert good.health().state == "running"


@pytest.fixture
def canned_server():
    """A real HTTP server answering every GET with a fixed status and body."""
    servers = []

    def make(status: int, body: bytes) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                return None

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/metrics"

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_malformed_text_is_a_reading_error(canned_server) -> None:
    src = LatencySource(canned_server(200, b'# TYPE x histogram\nx_bucket{le="0.1" 3\n'), "x")
    with pytest.raises(ReadingError, match="malformed") as raised:
        src.read()
    assert not isinstance(raised.value, NoAnswer)  # it answered, wrongly: no news about the server's state
    assert src.health().error_count == 1


def test_histogram_without_inf_bucket_is_a_reading_error(canned_server) -> None:
    src = LatencySource(canned_server(200, b'x_bucket{le="0.1"} 3\nx_count 3\nx_sum 0.1\n'), "x")
    with pytest.raises(ReadingError, match=r"\+Inf"):
        src.read()


def test_http_error_status_is_a_reading_error(canned_server) -> None:
    src = LatencySource(canned_server(503, b"overloaded"), METRIC)
    with pytest.raises(ReadingError, match="HTTP 503") as raised:
        src.read()
    assert not isinstance(raised.value, NoAnswer)  # an error status is an answer
    assert src.health().error_count == 1


def test_histogram_quantile_edges() -> None:
    assert histogram_quantile(0.5, {0.1: 0, math.inf: 0}) is None
    assert histogram_quantile(0.99, {0.1: 1, 1.0: 1, math.inf: 5}) == 1.0  # in +Inf: top finite bound
    with pytest.raises(ValueError, match="1.5"):
        histogram_quantile(1.5, {math.inf: 1})


@pytest.mark.parametrize("kw, bad", [({"url": "ftp://x"}, "ftp://x"), ({"metric": "lat_bucket"}, "lat_bucket"),
                                     ({"timeout": 0}, "0"), ({"kind": "summary"}, "summary"),
                                     ({"kind": "counter"}, "None"), ({"unit_seconds": -1}, "-1")])
def test_bad_arguments_quote_the_value(kw, bad) -> None:
    args = {"url": "http://127.0.0.1:1/metrics", "metric": "lat", "timeout": 1.0} | kw
    with pytest.raises(ValueError, match=bad):
        LatencySource(**args)


def triton_source(server: Server, clock=None) -> LatencySource:
    kw = {"clock": clock} if clock else {}
    return LatencySource(server.url, "nv_inference_request_duration_us", kind="counter",
                         count_metric="nv_inference_request_success", unit_seconds=1e-6, **kw)


def test_counter_kind_gives_requests_rate_and_mean(server: Server) -> None:
    clock = FakeClock()
    src = triton_source(server, clock)
    server.duration_us.labels(model="a").inc(1_000_000)
    server.success.labels(model="a").inc(10)
    src.prime()
    durations_us = [20_000, 40_000, 60_000, 80_000]
    for i, d in enumerate(durations_us):
        model = "ab"[i % 2]
        server.duration_us.labels(model=model).inc(d)
        server.success.labels(model=model).inc()
    clock.now += 2.0
    reading = src.read()
    assert reading.requests == 4 and reading.request_rate == pytest.approx(2.0)
    assert reading.p50_seconds is None and reading.p99_seconds is None
    assert src.last_mean_seconds == pytest.approx(np.mean(durations_us) * 1e-6)


def test_counter_kind_reset(server: Server) -> None:
    src = triton_source(server)
    server.duration_us.labels(model="a").inc(5_000_000)
    server.success.labels(model="a").inc(100)
    src.prime()
    server.restart()
    server.duration_us.labels(model="a").inc(30_000)
    server.success.labels(model="a").inc(3)
    reading = src.read()
    assert reading.requests == 3
    assert src.last_mean_seconds == pytest.approx(0.01)
    assert src.health().detail["counter_resets"] == 2


def test_counter_kind_missing_counter_is_a_reading_error(server: Server) -> None:
    src = LatencySource(server.url, "nv_inference_request_duration_us", kind="counter",
                        count_metric="nv_no_such_counter")
    server.duration_us.labels(model="a").inc(1)
    with pytest.raises(ReadingError, match="nv_no_such_counter"):
        src.read()


def test_counter_kind_declared_but_unused_counts_zero(server: Server) -> None:
    src = triton_source(server)
    src.prime()
    reading = src.read()
    assert reading.requests == 0 and src.last_mean_seconds is None


def test_a_refused_url_is_quoted_without_its_credentials() -> None:
    with pytest.raises(ValueError, match=r"ftp://\*\*\*@host/metrics") as err:
        LatencySource("ftp://user:s3cretpw@host/metrics", "lat")
    assert "s3cretpw" not in str(err.value)
