"""The server's view of a step from real Prometheus exposition text (prometheus_client renders it)."""

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from agent.loadtest.server_metrics import ServerSampler, measure_background, summarize
from analysis.errors import ReadingError
from workload.metrics import create_metrics


class VllmLike:
    """The metric names and buckets vLLM (and the bundled server) export."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "e2e", ["model_name"],
                             buckets=(0.1, 0.2, 0.5, 1.0, 2.0), registry=self.registry)
        # The bundled server's own name and buckets (workload/metrics.py).
        self.batch = Histogram("workload_batch_size", "batch", ["model_name"], buckets=(1, 2, 4, 8, 16, 32, 64, 128),
                               registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_latency_is_the_delta_between_first_and_last_scrape_and_gauges_skip_the_first():
    m = VllmLike()
    for _ in range(50):
        m.e2e.labels("tiny").observe(5.0)  # before the step: must not count
    m.waiting.labels("tiny").set(50)  # the step before's backlog, scraped as this step begins: must not count
    m.running.labels("tiny").set(9)
    texts = [m.text()]
    for value in [0.15] * 90 + [0.8] * 10:
        m.e2e.labels("tiny").observe(value)
    for size in (2, 4, 6):
        m.batch.labels("tiny").observe(size)
    for waiting in (0, 4, 8):
        m.waiting.labels("tiny").set(waiting)
        m.running.labels("tiny").set(2)
        texts.append(m.text())
    s = summarize(texts)
    assert s.p50_s == pytest.approx(0.1 + 0.1 * 50 / 90)
    assert 0.5 < s.p95_s <= 1.0 and s.p99_s <= 1.0
    assert s.waiting_mean == pytest.approx(4.0) and s.waiting_max == 8
    assert s.running_mean == pytest.approx(2.0) and s.batch_mean == pytest.approx(4.0)
    assert s.errors == {}


def test_the_bundled_servers_batch_histogram_is_read_by_its_current_name():
    registry = CollectorRegistry()
    server = create_metrics(registry, "tiny")  # the server's real metric set, not a copy of its names
    before = generate_latest(registry).decode()
    for size in (1, 3, 8):
        server.observe_step(size, tokens=size)
    s = summarize([before, generate_latest(registry).decode()])
    assert s.batch_mean == pytest.approx(4.0) and "batch" not in s.errors


def test_the_old_colon_name_is_still_read():
    reg = CollectorRegistry()
    h = Histogram("workload:batch_size", "batch", ["model_name"], buckets=(1, 2, 4), registry=reg)
    h.labels("tiny")
    before = generate_latest(reg).decode()
    h.labels("tiny").observe(2)
    assert summarize([before, generate_latest(reg).decode()]).batch_mean == pytest.approx(2.0)


def test_an_endpoint_without_the_metrics_gives_reasons_not_zeros():
    reg = CollectorRegistry()
    Gauge("something_else", "x", registry=reg).set(1)
    text = generate_latest(reg).decode()
    s = summarize([text, text])
    assert s.p95_s is None and s.waiting_mean is None and s.batch_mean is None
    assert "no latency histogram" in s.errors["server_latency"] and "no queue gauge" in s.errors["queue"]


def test_one_scrape_is_not_enough():
    s = summarize([VllmLike().text()])
    assert s.p95_s is None and "need two" in s.errors["scrape"]


def test_sampler_keeps_scraping_errors_as_reasons():
    calls = []

    def fetch(url: str, timeout: float) -> str:
        calls.append(url)
        raise ReadingError(f"latency endpoint {url} unreachable: refused")

    sampler = ServerSampler("http://127.0.0.1:1/metrics", interval_s=0.05, fetch=fetch)
    with pytest.raises(ReadingError, match="unreachable"):
        sampler.check()
    sampler.start()
    s = sampler.finish()
    assert s.p95_s is None and "unreachable" in s.errors["scrape"] and len(calls) >= 3


def _counter_text(n: int) -> str:
    """The bundled server's real metric set (vLLM's names) after `n` finished requests of two kinds."""
    registry = CollectorRegistry()
    server = create_metrics(registry, "tiny")
    server.success.labels(model_name="tiny", finished_reason="stop").inc(n - n // 4)
    server.success.labels(model_name="tiny", finished_reason="length").inc(n // 4)
    return generate_latest(registry).decode()


def _histogram_text(n: int) -> str:
    """A server with a latency histogram and no request counter."""
    server = VllmLike()
    for _ in range(n):
        server.e2e.labels(model_name="tiny").observe(0.15)
    return server.text()


class Scrapes:
    """The endpoint's successive answers, and a clock that the wait between them moves."""

    def __init__(self, *texts: str) -> None:
        self.texts, self.now = list(texts), 100.0

    def fetch(self, url: str, timeout: float) -> str:
        item = self.texts.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _background(*texts):
    s = Scrapes(*texts)
    return measure_background(s.fetch, "http://x/metrics", 5.0, sleep=s.sleep, clock=lambda: s.now)


def test_background_rate_from_the_request_counter_else_the_latency_histogram():
    b = _background(_counter_text(100), _counter_text(110))
    assert (b.rps, b.seconds, b.metric, b.reason) == (pytest.approx(2.0), 5.0, "vllm:request_success", None)
    assert b.text().startswith("WARNING: the server already served 2.00 req/s of other traffic")
    h = _background(_histogram_text(7), _histogram_text(12))
    assert h.rps == pytest.approx(1.0) and h.metric == "vllm:e2e_request_latency_seconds_count"
    idle = _background(_counter_text(5), _counter_text(5))
    assert idle.rps == 0 and idle.text().startswith("no background traffic")


def test_background_that_cannot_be_measured_says_why_never_zero():
    none = _background("# TYPE other_total counter\nother_total 3\n")
    assert none.rps is None and "no request counter (vllm:request_success or tgi_request_count)" in none.reason
    reset = _background(_counter_text(100), _counter_text(3))
    assert reset.rps is None and "went back" in reset.reason
    failed = _background(_counter_text(1), ReadingError("connection refused"))
    assert failed.rps is None and failed.reason == "scrape failed: connection refused"
    assert failed.text() == "background traffic not measured: scrape failed: connection refused"
