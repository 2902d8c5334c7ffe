"""Request latency per window: the delta of a server's Prometheus histogram between two scrapes."""

from __future__ import annotations

import http.client
import math
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from agent.presets import ServerFigures
from analysis.errors import NoAnswer, ReadingError
from analysis.health import Health
from analysis.redact import redact_text, redact_url
from analysis.window import LatencyReading

Fetch = Callable[[str, float], str]
QUANTILES = (0.5, 0.95, 0.99)


def http_fetch(url: str, timeout: float) -> str:
    """GET `url`; every failure becomes a ReadingError naming the url, a NoAnswer when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise ReadingError(f"latency endpoint {redact_url(url)} answered HTTP {exc.code}") from exc
    except urllib.error.URLError as exc:
        # urllib wraps what fails before the request is sent: the connection itself.
        reason = redact_text(str(exc.reason))
        if not isinstance(exc.reason, OSError):  # "unknown url type": our configuration, not the server
            raise ReadingError(f"latency endpoint {redact_url(url)} unusable: {reason}") from exc
        raise NoAnswer(f"latency endpoint {redact_url(url)} unreachable: {reason}", stage="connect") from exc
    except OSError as exc:  # after the request went out: no reply in time, or the connection dropped
        raise NoAnswer(f"latency endpoint {redact_url(url)} did not answer: {redact_text(str(exc)) or type(exc).__name__}",
                       stage="response") from exc
    except http.client.HTTPException as exc:  # it answered, but not HTTP: a wrong answer, which must not end the tick
        raise ReadingError(f"latency endpoint {redact_url(url)} answered something that is not HTTP: "
                           f"{type(exc).__name__} {redact_text(str(exc))[:80]!r}") from exc
    except ValueError as exc:  # a URL urllib cannot use: our configuration, not news about the server
        raise ReadingError(f"latency endpoint {redact_url(url)} unusable: {redact_text(str(exc))}") from exc


@dataclass
class HistogramSnapshot:
    """One scrape of one histogram: cumulative values per label set (without `le`)."""

    buckets: dict[tuple, dict[float, float]] = field(default_factory=dict)
    sums: dict[tuple, float] = field(default_factory=dict)
    counts: dict[tuple, float] = field(default_factory=dict)


def parse_histogram(text: str, metric: str) -> HistogramSnapshot:
    """Pick `<metric>_bucket/_sum/_count` out of exposition text; ReadingError if absent or malformed."""
    snap = HistogramSnapshot()
    names = []
    try:
        for family in text_string_to_metric_families(text):
            names.append(family.name)
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                key = tuple(sorted(labels.items()))
                if s.name == f"{metric}_bucket":
                    le = float(s.labels["le"])  # "+Inf" parses to inf
                    snap.buckets.setdefault(key, {})[le] = s.value
                elif s.name == f"{metric}_sum":
                    snap.sums[key] = s.value
                elif s.name == f"{metric}_count":
                    snap.counts[key] = s.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReadingError(f"malformed Prometheus text while looking for {metric!r}: {exc}") from exc
    if not snap.buckets and metric not in names:
        # A declared histogram with no series yet (labelled, nothing observed since start) is
        # an empty reading, not an error.
        shown = ", ".join(sorted(set(names))[:8]) or "nothing"
        raise ReadingError(f"histogram {metric!r} not found (the endpoint exposes {shown})")
    for key, buckets in snap.buckets.items():
        if math.inf not in buckets:
            raise ReadingError(f"histogram {metric!r} {dict(key)} has no le=\"+Inf\" bucket")
    return snap


def histogram_delta(prev: HistogramSnapshot | None, cur: HistogramSnapshot) -> tuple[dict[float, float], float, int]:
    """Cumulative buckets, sum and count observed between two scrapes, summed over label sets.

    Like Prometheus's rate(): a label set whose count, sum or any bucket went down was reset
    (the server restarted), so its new value is the whole delta; a label set new since the
    previous scrape counts in full too. Returns (buckets, sum, resets).
    """
    total: dict[float, float] = {}
    total_sum = 0.0
    resets = 0
    for key, buckets in cur.buckets.items():
        before = prev.buckets.get(key) if prev else None
        s_now, s_before = cur.sums.get(key, 0.0), (prev.sums.get(key, 0.0) if prev else 0.0)
        c_now, c_before = cur.counts.get(key, 0.0), (prev.counts.get(key, 0.0) if prev else 0.0)
        reset = before is not None and (
            c_now < c_before or s_now < s_before or any(v < before.get(le, 0.0) for le, v in buckets.items()))
        if reset:
            resets += 1
        if before is None or reset:
            before, s_before = {}, 0.0
        for le, v in buckets.items():
            total[le] = total.get(le, 0.0) + v - before.get(le, 0.0)
        total_sum += s_now - s_before
    return total, total_sum, resets


Series = dict[tuple, float]


def parse_counters(text: str, names: tuple[str, ...]) -> dict[str, Series]:
    """Values of each counter in `names` per label set; ReadingError if one is absent or text is bad."""
    found: dict[str, Series] = {n: {} for n in names}
    seen: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            if family.name in found:
                seen.add(family.name)  # declared without series yet (no request so far): zero, not missing
            for s in family.samples:
                # A counter declared as `x` is exposed as `x_total` by OpenMetrics-style clients.
                name = s.name[:-len("_total")] if s.name.endswith("_total") and s.name not in found else s.name
                if name in found:
                    seen.add(name)
                    found[name][tuple(sorted(s.labels.items()))] = s.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReadingError(f"malformed Prometheus text while looking for {', '.join(names)}: {exc}") from exc
    if missing := [n for n in names if n not in seen]:
        raise ReadingError(f"counter {missing[0]!r} not found at the endpoint")
    return found


def counter_delta(prev: Series | None, cur: Series) -> tuple[float, int]:
    """Increase of a counter summed over label sets; a series that went down was reset (as rate())."""
    total, resets = 0.0, 0
    for key, value in cur.items():
        before = prev.get(key) if prev else None
        if before is None:
            total += value
        elif value < before:
            resets += 1
            total += value
        else:
            total += value - before
    return total, resets


def parse_samples(text: str, names: set[str]) -> dict[str, Series]:
    """Values of the exact sample names in `names` per label set; a name the text lacks is absent."""
    found: dict[str, Series] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in names:
                    found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReadingError(f"malformed Prometheus text while reading the server's figures: {exc}") from exc
    return found


def relevant_text(text: str, prefixes: tuple[str, ...]) -> str:
    """Only the lines of the families whose names start with `prefixes`: their samples and their # HELP/# TYPE.

    The parser costs ~12 µs a line; a server's /metrics holds hundreds of lines we never read (the workload's 244
    took 3 ms per parse, twice per window). Lines are kept whole, so what is parsed means what it meant."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) > 2 and parts[2].startswith(prefixes):
                kept.append(line)
        elif line.startswith(prefixes):
            kept.append(line)
    kept.append("")
    return "\n".join(kept)


def figure_names(figures: ServerFigures) -> set[str]:
    """Every sample name the figures need: counters and gauges as named, histograms' _sum and _count."""
    names = {n for n in (figures.tokens, figures.waiting, figures.running) if n}
    for base in (figures.ttft, figures.tpot, figures.queue, figures.prefill, figures.decode):
        if base:
            names.update((f"{base}_sum", f"{base}_count"))
    return names


def _increase(prev: dict[str, Series], cur: dict[str, Series], name: str) -> float | None:
    if name not in cur:
        return None
    return counter_delta(prev.get(name), cur[name])[0]


def _histogram_mean(prev: dict[str, Series], cur: dict[str, Series], base: str | None) -> float | None:
    """This window's mean of a histogram: increase of _sum over increase of _count; None without observations."""
    if base is None:
        return None
    total, count = _increase(prev, cur, f"{base}_sum"), _increase(prev, cur, f"{base}_count")
    if total is None or not count:
        return None
    return total / count


def _gauge(cur: dict[str, Series], name: str | None) -> float | None:
    if name is None or name not in cur:
        return None
    return sum(cur[name].values())


def bucket_counts(cumulative: dict[float, float]) -> dict[str, float]:
    """Cumulative buckets -> requests per bucket, keyed by the upper bound as Prometheus writes it ("0.1", "+Inf")."""
    out: dict[str, float] = {}
    below = 0.0
    for le in sorted(cumulative):
        value = max(cumulative[le], below)  # a torn scrape can leave a bucket below the one before it
        out["+Inf" if le == math.inf else repr(le).removesuffix(".0")] = value - below
        below = value
    return out


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """PromQL's histogram_quantile over cumulative buckets {upper bound: count}; None when empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q!r}")
    bounds = sorted(buckets)
    if not bounds or bounds[-1] != math.inf:
        raise ValueError(f"buckets need a +Inf bound, got {bounds!r}")
    counts, running = [], 0.0
    for le in bounds:
        running = max(running, buckets[le])  # as PromQL: repair non-monotonic buckets from torn scrapes
        counts.append(running)
    observations = counts[-1]
    if observations <= 0 or len(bounds) < 2:
        return None
    rank = q * observations
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if b == 0 else bounds[b - 1]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return bounds[b]
    return start + (bounds[b] - start) * (rank - below) / in_bucket


class LatencySource:
    """Scrapes `url` each read() and returns the request latency's delta since the previous read.

    kind "histogram": `metric` is a histogram family; p50/p95/p99 come from the bucket deltas.
    kind "counter": `metric` is a cumulative request-duration counter and `count_metric` the
    completed-request counter (Triton's shape); only requests, rate and `last_mean_seconds`
    are derivable, so the quantiles stay None. `unit_seconds` converts the metric's unit.
    """

    name = "latency"

    def __init__(self, url: str, metric: str, timeout: float = 2.0, kind: str = "histogram",
                 count_metric: str | None = None, unit_seconds: float = 1.0, fetch: Fetch = http_fetch,
                 clock: Callable[[], float] = time.monotonic, figures: ServerFigures | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"latency url must be http(s)://..., got {redact_url(url)!r}")
        if kind not in ("histogram", "counter"):
            raise ValueError(f"latency kind must be 'histogram' or 'counter', got {kind!r}")
        if not metric or (kind == "histogram" and metric.endswith(("_bucket", "_sum", "_count"))):
            raise ValueError(f"metric must be the histogram's base name (without _bucket), got {metric!r}")
        if kind == "counter" and not count_metric:
            raise ValueError(f"a counter latency metric needs count_metric (requests), got {count_metric!r}")
        if not 0 < timeout <= 60:
            raise ValueError(f"timeout must be within (0, 60] seconds, got {timeout!r}")
        if not unit_seconds > 0:
            raise ValueError(f"unit_seconds must be positive, got {unit_seconds!r}")
        self.url, self.metric, self.timeout, self.kind = url, metric, timeout, kind
        self.count_metric, self.unit_seconds = count_metric, unit_seconds
        self._fetch, self._clock = fetch, clock
        # Only the names a preset lists are read: never anything else the server exports.
        self.figures = figures
        self._figure_names = figure_names(figures) if figures else set()
        self._prefixes = (metric, *([count_metric] if count_metric else []), *sorted(self._figure_names))
        self._prev_figures: dict[str, Series] = {}
        self._prev: HistogramSnapshot | dict[str, Series] | None = None
        self._prev_at: float | None = None
        self._errors = 0
        self._last_error: str | None = None
        self._scrapes = 0
        self._resets = 0
        self.last_mean_seconds: float | None = None

    def prime(self) -> None:
        """Take the baseline scrape now, so the first read() already has a delta."""
        self._scrape()

    def read(self) -> LatencyReading:
        """Delta since the previous successful scrape; the very first call only sets the baseline.

        Raises ReadingError (counted in health) when the endpoint or the metric fails; the
        baseline is kept, so the next good scrape covers the missed interval too.
        """
        prev, prev_at, prev_figures = self._prev, self._prev_at, self._prev_figures
        cur, now = self._scrape()
        if prev is None or prev_at is None:
            return LatencyReading()
        elapsed = now - prev_at
        if isinstance(cur, HistogramSnapshot):
            assert isinstance(prev, HistogramSnapshot)
            buckets, total_sum, resets = histogram_delta(prev, cur)
            requests = buckets.get(math.inf, 0.0)
            p50, p95, p99 = (self._seconds(histogram_quantile(q, buckets)) if buckets else None for q in QUANTILES)
            per_bucket = bucket_counts(buckets) if buckets else {}
        else:
            assert isinstance(prev, dict) and self.count_metric is not None
            total_sum, r1 = counter_delta(prev[self.metric], cur[self.metric])
            requests, r2 = counter_delta(prev[self.count_metric], cur[self.count_metric])
            resets = r1 + r2
            p50 = p95 = p99 = None
            per_bucket = {}
        self._resets += resets
        self.last_mean_seconds = self._seconds(total_sum / requests) if requests > 0 else None
        reading = LatencyReading(p50_seconds=p50, p95_seconds=p95, p99_seconds=p99,
                                 mean_seconds=self.last_mean_seconds, requests=requests,
                                 request_rate=requests / elapsed if elapsed > 0 else 0.0, buckets=per_bucket)
        if self.figures is not None:
            self._fill_figures(reading, prev_figures, self._prev_figures, elapsed)
        return reading

    def _fill_figures(self, reading: LatencyReading, prev: dict[str, Series], cur: dict[str, Series],
                      elapsed: float) -> None:
        f = self.figures
        assert f is not None
        tokens = _increase(prev, cur, f.tokens) if f.tokens else None
        reading.tokens_per_second = tokens / elapsed if tokens is not None and elapsed > 0 else None
        reading.waiting, reading.running = _gauge(cur, f.waiting), _gauge(cur, f.running)
        reading.ttft_mean_seconds = self._seconds(_histogram_mean(prev, cur, f.ttft))
        reading.tpot_mean_seconds = self._seconds(_histogram_mean(prev, cur, f.tpot))
        reading.queue_mean_seconds = self._seconds(_histogram_mean(prev, cur, f.queue))
        reading.prefill_mean_seconds = self._seconds(_histogram_mean(prev, cur, f.prefill))
        reading.decode_mean_seconds = self._seconds(_histogram_mean(prev, cur, f.decode))

    def close(self) -> None:
        self._prev = None

    def health(self) -> Health:
        state = "failed" if self._last_error else "running"
        return Health(name=self.name, state=state, reason=self._last_error, errors=self._errors,
                      detail={"url": redact_url(self.url), "metric": self.metric, "kind": self.kind,
                              "scrapes": self._scrapes, "counter_resets": self._resets,
                              "mean_seconds": self.last_mean_seconds})

    def _seconds(self, value: float | None) -> float | None:
        return None if value is None else value * self.unit_seconds

    def _parse(self, text: str) -> tuple[HistogramSnapshot | dict[str, Series], dict[str, Series]]:
        snap: HistogramSnapshot | dict[str, Series]
        if self.kind == "histogram":
            snap = parse_histogram(text, self.metric)
        else:
            assert self.count_metric is not None
            snap = parse_counters(text, (self.metric, self.count_metric))
        return snap, parse_samples(text, self._figure_names) if self._figure_names else {}

    def _scrape(self) -> tuple[HistogramSnapshot | dict[str, Series], float]:
        try:
            text = self._fetch(self.url, self.timeout)
            try:
                snap, figures = self._parse(relevant_text(text, self._prefixes))
            except ReadingError:
                # The whole text names what is wrong (a malformed line elsewhere, what the endpoint does expose).
                snap, figures = self._parse(text)
        except ReadingError as exc:
            self._errors += 1
            self._last_error = str(exc)
            raise
        now = self._clock()
        self._prev, self._prev_at, self._prev_figures = snap, now, figures
        self._scrapes += 1
        self._last_error = None
        return snap, now
