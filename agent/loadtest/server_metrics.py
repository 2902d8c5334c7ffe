"""The server's own view of a step from its Prometheus endpoint: latency histogram, queue and batch gauges."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from agent.sources.latency import HistogramSnapshot, histogram_delta, histogram_quantile, http_fetch, parse_histogram
from analysis.errors import ReadingError

# vLLM's names (the bundled server uses them too), then TGI's.
WAITING_GAUGES = ("vllm:num_requests_waiting", "tgi_queue_size")
RUNNING_GAUGES = ("vllm:num_requests_running", "tgi_batch_current_size")
LATENCY_HISTOGRAMS = ("vllm:e2e_request_latency_seconds", "tgi_request_duration")
# vLLM exports no batch-size histogram; the bundled server's own is `workload_batch_size` (renamed from
# `workload:batch_size` in f829986, colons being for recording rules), kept for servers still on the old name.
BATCH_HISTOGRAMS = ("workload_batch_size", "workload:batch_size", "tgi_batch_next_size")
# Finished requests: vLLM's counter (the bundled server's too), TGI's; else the latency histogram's count.
REQUEST_COUNTERS = ("vllm:request_success", "tgi_request_count")
# Long enough to see a demo's 1-2 req/s a handful of times, short enough not to matter before a run of minutes.
BACKGROUND_SECONDS = 5.0


@dataclass
class ServerStep:
    """Server-side figures of one step; None where the endpoint does not export the metric (reason kept)."""

    p50_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    running_mean: float | None = None
    batch_mean: float | None = None
    scrapes: int = 0
    errors: dict[str, str] = field(default_factory=dict)


def _gauge(text: str, names: tuple[str, ...]) -> float | None:
    """Sum over label sets of the first of `names` the text has."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            found[family.name] = sum(s.value for s in family.samples)
    return next((found[n] for n in names if n in found), None)


def _histogram(text: str, names: tuple[str, ...]) -> tuple[str, HistogramSnapshot] | None:
    for name in names:
        try:
            return name, parse_histogram(text, name)
        except ReadingError:
            continue
    return None


def requests_served(text: str) -> tuple[str, float] | None:
    """(metric, count) of the requests the server has finished since it started, or None when it exports none."""
    for family in text_string_to_metric_families(text):
        if family.name in REQUEST_COUNTERS:
            return family.name, sum(s.value for s in family.samples if s.name.endswith("_total"))
    found = _histogram(text, LATENCY_HISTOGRAMS)
    if found is not None and found[1].counts:
        return f"{found[0]}_count", sum(found[1].counts.values())
    return None


@dataclass
class BackgroundLoad:
    """The request rate the server had before the first step (someone else's traffic); None + reason if unknown."""

    rps: float | None
    seconds: float
    metric: str | None = None
    reason: str | None = None

    def text(self) -> str:
        """One line for the progress, the summary and the HTML report."""
        if self.rps is None:
            return f"background traffic not measured: {self.reason}"
        if self.rps == 0:
            return f"no background traffic: the server finished no request in the {self.seconds:.0f} s before step 1"
        return (f"WARNING: the server already served {self.rps:.2f} req/s of other traffic ({self.metric} over "
                f"{self.seconds:.0f} s before step 1): each step's load at the server was its offered rate plus that")


def measure_background(fetch: Callable[[str, float], str], url: str, seconds: float = BACKGROUND_SECONDS,
                       sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.monotonic) -> BackgroundLoad:
    """Two scrapes `seconds` apart, before the load test sends anything: the server's request counter's rate."""
    try:
        first, began = requests_served(fetch(url, 2.0)), clock()
        if first is None:
            return BackgroundLoad(None, 0.0, reason=f"no request counter ({' or '.join(REQUEST_COUNTERS)}) or "
                                                    f"latency histogram at the endpoint")
        sleep(seconds)
        last, ended = requests_served(fetch(url, 2.0)), clock()
    except (ReadingError, ValueError) as exc:
        return BackgroundLoad(None, 0.0, reason=f"scrape failed: {exc}")
    if last is None or last[0] != first[0]:
        return BackgroundLoad(None, ended - began, reason="the request counter vanished between two scrapes")
    if last[1] < first[1]:
        return BackgroundLoad(None, ended - began, first[0], reason="the request counter went back (server restarted)")
    return BackgroundLoad((last[1] - first[1]) / (ended - began), ended - began, first[0])


class ServerSampler:
    """Scrapes the endpoint once a second during a step; `finish()` returns the step's ServerStep."""

    def __init__(self, url: str, interval_s: float = 1.0, fetch: Callable[[str, float], str] = http_fetch) -> None:
        self.url, self.interval_s, self._fetch = url, interval_s, fetch
        self._texts: list[str] = []
        self._errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """One scrape now; ReadingError with the reason when the endpoint does not answer."""
        self._fetch(self.url, 2.0)

    def background(self, seconds: float = BACKGROUND_SECONDS) -> BackgroundLoad:
        """The server's request rate over `seconds`, before any step (measure_background)."""
        return measure_background(self._fetch, self.url, seconds)

    def start(self) -> None:
        self._texts, self._errors = [], {}
        self._stop.clear()
        self._scrape()
        self._thread = threading.Thread(target=self._run, name="loadtest-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._scrape()

    def _scrape(self) -> None:
        try:
            self._texts.append(self._fetch(self.url, 2.0))
        except ReadingError as exc:
            self._errors["scrape"] = str(exc)

    def finish(self) -> ServerStep:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self._scrape()
        return summarize(self._texts, self._errors)


def summarize(texts: list[str], errors: dict[str, str] | None = None) -> ServerStep:
    """Gauges averaged over the step's scrapes; histograms as the delta from the first scrape to the last.

    The first scrape is taken before the step's first request: it is the histograms' starting point, and its
    gauges describe the step before (an idle or draining queue), so they are not averaged into this one.
    """
    out = ServerStep(scrapes=len(texts), errors=dict(errors or {}))
    if len(texts) < 2:
        out.errors.setdefault("scrape", f"{len(texts)} scrape(s) of the endpoint; need two for a delta")
        return out
    try:
        during = texts[1:]
        waiting = [v for t in during if (v := _gauge(t, WAITING_GAUGES)) is not None]
        running = [v for t in during if (v := _gauge(t, RUNNING_GAUGES)) is not None]
        first_lat, last_lat = _histogram(texts[0], LATENCY_HISTOGRAMS), _histogram(texts[-1], LATENCY_HISTOGRAMS)
        first_b, last_b = _histogram(texts[0], BATCH_HISTOGRAMS), _histogram(texts[-1], BATCH_HISTOGRAMS)
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        out.errors["parse"] = f"malformed Prometheus text: {exc}"
        return out
    if waiting:
        out.waiting_mean, out.waiting_max = sum(waiting) / len(waiting), max(waiting)
    else:
        out.errors["queue"] = f"no queue gauge ({' or '.join(WAITING_GAUGES)}) at the endpoint"
    if running:
        out.running_mean = sum(running) / len(running)
    if first_lat and last_lat:
        buckets, _, _ = histogram_delta(first_lat[1], last_lat[1])
        if buckets and max(buckets.values()) > 0:
            out.p50_s, out.p95_s, out.p99_s = (histogram_quantile(q, buckets) for q in (0.5, 0.95, 0.99))
        else:
            out.errors["server_latency"] = "no request finished at the server during the step"
    else:
        out.errors["server_latency"] = f"no latency histogram ({' or '.join(LATENCY_HISTOGRAMS)}) at the endpoint"
    if first_b and last_b:
        key_sum = sum(last_b[1].sums.values()) - sum(first_b[1].sums.values())
        key_count = sum(last_b[1].counts.values()) - sum(first_b[1].counts.values())
        if key_count > 0:
            out.batch_mean = key_sum / key_count
    else:
        out.errors["batch"] = f"no batch-size histogram ({' or '.join(BATCH_HISTOGRAMS)}) at the endpoint"
    return out
