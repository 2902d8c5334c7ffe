"""Request latency per window: the delta of a server's Prometheus histogram between two scrapes."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_fd_to_metric_families, text_string_to_metric_families

from agent.presets import ServerFigures
from agent.sources.flight import Flight
from agent.sources.listener import ListenerCheck
from agent.sources.scrape import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SERIES,
    Exchange,
    Limits,
    Scraped,
    deadline_lines,
    filter_text,
)
from analysis.errors import NoAnswer, ReadingError
from analysis.health import Health
from analysis.redact import redact_text, redact_url
from analysis.window import LatencyReading

log = logging.getLogger("infersight.sources")

# An injected fetch (tests, canned answers): url, deadline seconds -> the whole text.
Fetch = Callable[[str, float], str]
QUANTILES = (0.5, 0.95, 0.99)
# The load test reads a whole /metrics: every family, under a larger cap than a watched target's.
_FETCH_ALL_MAX_BYTES = 64 << 20


def http_fetch(url: str, timeout: float) -> str:
    """GET `url`, all of it, within `timeout` seconds for the whole exchange (agent/sources/scrape.py); every failure
    is a ReadingError naming the url, a NoAnswer when nothing answered."""
    return Exchange(url, Limits(timeout, max_body_bytes=_FETCH_ALL_MAX_BYTES), prefixes=None).run().text


def _families(text: str, deadline: float | None):
    if deadline is None:
        return text_string_to_metric_families(text)
    return text_fd_to_metric_families(deadline_lines(text, deadline, "latency endpoint"))


@dataclass
class HistogramSnapshot:
    """One scrape of one histogram: cumulative values per label set (without `le`)."""

    buckets: dict[tuple, dict[float, float]] = field(default_factory=dict)
    sums: dict[tuple, float] = field(default_factory=dict)
    counts: dict[tuple, float] = field(default_factory=dict)


def parse_histogram(text: str, metric: str, exposed: Iterable[str] = (),
                    deadline: float | None = None) -> HistogramSnapshot:
    """Pick `<metric>_bucket/_sum/_count` out of exposition text; ReadingError if absent or malformed. `exposed`:
    family names the endpoint declared beyond those in `text` (a filtered answer), for the "not found" error;
    `deadline` (monotonic): when parsing must have ended."""
    snap = HistogramSnapshot()
    names = list(exposed)
    try:
        for family in _families(text, deadline):
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


def parse_counters(text: str, names: tuple[str, ...], deadline: float | None = None) -> dict[str, Series]:
    """Values of each counter in `names` per label set; ReadingError if one is absent or text is bad."""
    found: dict[str, Series] = {n: {} for n in names}
    seen: set[str] = set()
    try:
        for family in _families(text, deadline):
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


def parse_samples(text: str, names: set[str], deadline: float | None = None) -> dict[str, Series]:
    """Values of the exact sample names in `names` per label set; a name the text lacks is absent."""
    found: dict[str, Series] = {}
    try:
        for family in _families(text, deadline):
            for s in family.samples:
                if s.name in names:
                    found.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReadingError(f"malformed Prometheus text while reading the server's figures: {exc}") from exc
    return found


def relevant_text(text: str, prefixes: tuple[str, ...]) -> str:
    """Only the lines of the families whose names start with `prefixes`: their samples and their # HELP/# TYPE.

    The parser costs ~12 µs a line; a server's /metrics holds hundreds of lines we never read (the workload's 244
    took 3 ms per parse, twice per window). Lines are kept whole, so what is parsed means what it meant. A scrape
    filters the same way while the answer streams in (agent/sources/scrape.py)."""
    return filter_text(text, prefixes, max_series=len(text)).text


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


@dataclass
class _Scrape:
    """What one scrape gave, parsed: the histogram (or counters), the figures, and when it began (source clock)."""

    snap: HistogramSnapshot | dict[str, Series]
    figures: dict[str, Series]
    at: float
    scraped: Scraped


class LatencySource:
    """Scrapes `url` for each read() and returns the request latency's delta since the previous read.

    kind "histogram": `metric` is a histogram family; p50/p95/p99 come from the bucket deltas.
    kind "counter": `metric` is a cumulative request-duration counter and `count_metric` the
    completed-request counter (Triton's shape); only requests, rate and `last_mean_seconds`
    are derivable, so the quantiles stay None. `unit_seconds` converts the metric's unit.

    The scrape runs off the collection thread (agent/sources/flight.py): `begin()` starts it — the Collectors call
    it for every source at the top of a tick, so every target's scrape runs at once — and read() waits for it no
    longer than `timeout` after it began; a target still answering then has no reading (NoAnswer), and the others'
    windows are not held up. At most one scrape per target is in flight: while one past its deadline has not ended
    yet, the next read says so instead of starting another. `max_body_bytes` and `max_series` bound the answer
    (agent/sources/scrape.py). With `owner_pids` (the target family's pids), a loopback URL's listening socket must
    be one of theirs (agent/sources/listener.py), or the answer is not used.
    """

    name = "latency"

    def __init__(self, url: str, metric: str, timeout: float = 2.0, kind: str = "histogram",
                 count_metric: str | None = None, unit_seconds: float = 1.0, fetch: Fetch | None = None,
                 clock: Callable[[], float] = time.monotonic, figures: ServerFigures | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_series: int = DEFAULT_MAX_SERIES,
                 owner_pids: Callable[[], Iterable[int]] | None = None) -> None:
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
        self.limits = Limits(timeout, max_body_bytes=max_body_bytes, max_series=max_series)
        self._shown = f"latency endpoint {redact_url(url)}"
        self._fetch, self._clock = fetch, clock
        self._owner = ListenerCheck(url, owner_pids) if owner_pids is not None else None
        # Only the names a preset lists are read: never anything else the server exports.
        self.figures = figures
        self._figure_names = figure_names(figures) if figures else set()
        self._prefixes = (metric, *([count_metric] if count_metric else []), *sorted(self._figure_names))
        self._prev_figures: dict[str, Series] = {}
        self._prev: HistogramSnapshot | dict[str, Series] | None = None
        self._prev_at: float | None = None
        # The scrape for the next read (or, until consumed, the baseline begun by prime(wait=False)).
        self._flight: Flight[_Scrape] | None = None
        self._exchange: Exchange | None = None
        self._baseline: Flight[_Scrape] | None = None
        self._not_started: str | None = None
        self._closed = False
        self._errors = 0
        self._last_error: str | None = None
        self._warned = False
        self._scrapes = 0
        self._resets = 0
        self._last_bytes: int | None = None
        self._last_series: int | None = None
        self.last_mean_seconds: float | None = None

    # -- the scrape, off the collection thread ---------------------------------------------------

    def begin(self) -> None:
        """Start this read's scrape now, unless one is begun already (idempotent until read() takes it)."""
        flight = self._flight
        if self._closed:
            return
        if flight is not None and not flight.consumed:
            if flight is not self._baseline or not flight.done:
                return
            self._take_baseline(flight)
        if flight is not None and not flight.done:
            return  # past its deadline and not ended yet: never two scrapes of one target at once
        at = self._clock()
        exchange = Exchange(self.url, self.limits, self._prefixes) if self._fetch is None else None
        deadline = exchange.deadline if exchange else time.monotonic() + self.limits.deadline_seconds
        try:
            self._flight = Flight(lambda: self._scrape(exchange, at, deadline), name=f"scrape {redact_url(self.url)}",
                                  deadline=deadline, abort=exchange.abort if exchange else None)
        except RuntimeError as exc:  # no thread to be had: this read has no scrape
            self._not_started = f"{self._shown}: could not start the scrape: {exc}"
            return
        self._exchange, self._not_started = exchange, None

    def prime(self, wait: bool = True) -> None:
        """Take the baseline scrape, so the first read() already has a delta: now (raising what it raised), or,
        with wait=False, off the collection thread, taken by the first read that finds it done."""
        self.begin()
        self._baseline = self._flight
        if not wait or self._flight is None or self._flight.consumed:
            return
        self._take_baseline(self._flight, wait=True)

    def _take_baseline(self, flight: Flight[_Scrape], wait: bool = False) -> None:
        flight.consumed = True
        self._baseline = None
        try:
            result = self._result(flight)
        except ReadingError:
            if wait:
                raise
            return  # counted and shown in health; the next scrape is the baseline
        self._apply(result)

    def _result(self, flight: Flight[_Scrape]) -> _Scrape:
        """The flight's scrape, waited for until its deadline; every failure counted in health."""
        if not flight.wait():
            flight.cancel()
            exchange = self._exchange if flight is self._flight else None
            if exchange is not None and exchange.stage == "connect":
                raise self._failed(NoAnswer(f"{self._shown} unreachable: no connection within "
                                            f"{self.limits.deadline_seconds:g} s", stage="connect"))
            got = f", {exchange.received} bytes" if exchange is not None else ""
            raise self._failed(NoAnswer(f"{self._shown} did not answer: timed out{got} in "
                                        f"{self.limits.deadline_seconds:g} s (the whole answer must arrive "
                                        f"within the deadline)"))
        try:
            return flight.result()
        except ReadingError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: ReadingError) -> ReadingError:
        self._errors += 1
        self._last_error = str(exc)
        if not self._scrapes and not self._warned:
            self._warned = True
            # Once, not every window (those say it themselves). The log is read by more people than the config:
            # the URL's secrets stay out of it.
            log.warning("%s not answering yet: %s", self._shown, redact_text(str(exc)))
        return exc

    def _scrape(self, exchange: Exchange | None, at: float, deadline: float) -> _Scrape:
        """On the flight's thread: the owner check, the exchange and the parse; nothing of the source changes."""
        if self._owner is not None:
            self._owner.check()
        if exchange is not None:
            try:
                scraped = exchange.run()
            except NoAnswer as exc:
                if exc.stage == "connect" and self._owner is not None and self._owner.nothing_listens:
                    # Refused with no listening socket on the port at all: the server closed it (or has not
                    # opened it yet). A firewall's reset or drop leaves the target's listener in place.
                    raise NoAnswer(f"{exc}; nothing listens on port {self._owner.port}", stage="closed") from exc
                raise
        else:
            assert self._fetch is not None
            scraped = filter_text(self._fetch(self.url, self.limits.deadline_seconds), self._prefixes,
                                  self.limits.max_series)
        snap, figures = self._parse(scraped, deadline)
        return _Scrape(snap=snap, figures=figures, at=at, scraped=scraped)

    def _apply(self, result: _Scrape) -> None:
        self._prev, self._prev_at, self._prev_figures = result.snap, result.at, result.figures
        self._scrapes += 1
        self._last_error = None
        self._last_bytes, self._last_series = result.scraped.body_bytes, result.scraped.series

    # -- readings ---------------------------------------------------------------------------------

    def read(self) -> LatencyReading:
        """Delta since the previous successful scrape; the very first one only sets the baseline.

        Raises ReadingError (counted in health) when the endpoint or the metric fails, NoAnswer when nothing (or
        not all of the answer) came by the deadline; the baseline is kept, so the next good scrape covers the
        missed interval too.
        """
        if self._closed:
            raise ReadingError(f"{self._shown}: the source is closed")
        self.begin()
        flight = self._flight
        if self._not_started is not None or flight is None:
            raise self._failed(ReadingError(self._not_started or f"{self._shown}: no scrape started"))
        if flight.consumed:
            raise self._failed(NoAnswer(f"{self._shown} did not answer: the scrape begun "
                                        f"{time.monotonic() - flight.started:.1f} s ago is still running past "
                                        f"its deadline; none other is started until it ends"))
        flight.consumed = True
        if flight is self._baseline:
            self._baseline = None
        prev, prev_at, prev_figures = self._prev, self._prev_at, self._prev_figures
        result = self._result(flight)
        self._apply(result)
        if prev is None or prev_at is None:
            return LatencyReading()
        cur, elapsed = result.snap, result.at - prev_at
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
        """Stop a scrape in flight (its socket is shut down) and wait a moment for its thread; it is a daemon
        thread, so one stuck where nothing can stop it (a name lookup) does not hold up the agent's exit."""
        self._closed = True
        if self._flight is not None:
            self._flight.cancel(join_seconds=0.5)
        self._prev = None

    def health(self) -> Health:
        state = "failed" if self._last_error else "running"
        detail = {"url": redact_url(self.url), "metric": self.metric, "kind": self.kind,
                  "scrapes": self._scrapes, "counter_resets": self._resets, "mean_seconds": self.last_mean_seconds,
                  "deadline_seconds": self.limits.deadline_seconds, "max_body_bytes": self.limits.max_body_bytes,
                  "max_series": self.limits.max_series, "last_body_bytes": self._last_bytes,
                  "last_series": self._last_series,
                  "owner": self._owner.last if self._owner is not None else "not checked: no target pids given"}
        return Health(name=self.name, state=state, reason=self._last_error, error_count=self._errors, detail=detail)

    def _seconds(self, value: float | None) -> float | None:
        return None if value is None else value * self.unit_seconds

    def _parse(self, scraped: Scraped, deadline: float | None = None,
               ) -> tuple[HistogramSnapshot | dict[str, Series], dict[str, Series]]:
        snap: HistogramSnapshot | dict[str, Series]
        if self.kind == "histogram":
            snap = parse_histogram(scraped.text, self.metric, exposed=scraped.exposed, deadline=deadline)
        else:
            assert self.count_metric is not None
            snap = parse_counters(scraped.text, (self.metric, self.count_metric), deadline=deadline)
        figures = parse_samples(scraped.text, self._figure_names, deadline=deadline) if self._figure_names else {}
        return snap, figures
