"""The agent's OTLP export: a metrics thread and a log-record thread, each with its own deadline per request, so
a Collector that is down, refuses, answers 500 or drips never holds the collection loop or the page.

Metrics are cumulative (as on /metrics): a failed export is not retried, the next one carries the newer totals,
so an outage costs resolution, not counts, and nothing piles up in memory (one request body at a time, the size
of one /metrics answer). Regression records wait in the alert outbox (agent.otlp.events) and are retried with
the alerts' backoff until `[alerts] retry_max_age_seconds`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.alerts.config import AlertsConfig
from agent.alerts.delivery import MAX_ERROR_CHARS, backoff_seconds
from agent.alerts.transport import PostResult, post
from agent.otlp import metrics as otlp_metrics
from agent.otlp.config import OtlpSettings
from agent.otlp.events import OUTBOX_RECEIVER, RegressionEvents
from agent.otlp.exemplars import ExemplarWatch
from agent.store import Store
from agent.store.alerts import AGENT_OWNER, Outbox

log = logging.getLogger("infersight.otlp")
CONTENT_TYPE = "application/x-protobuf"
USER_AGENT = "infersight-otlp/1"
IDLE_POLL_SECONDS = 1.0


class OtlpExporter:
    def __init__(self, settings: OtlpSettings, registry: CollectorRegistry, store: Store, alerts: AlertsConfig, *,
                 host: str, external_url: str, started: float, on_error: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                 exemplars: ExemplarWatch | None = None) -> None:
        self.settings = settings
        self._registry = registry
        self._outbox = Outbox(store)
        self._alerts = alerts
        self._on_error = on_error or (lambda component: None)
        self._clock = clock
        self._rng = rng or random.Random()
        self._start_ns = int(started * 1e9)
        self._metrics_failing = False
        self.resource = Resource(dict(settings.resource))
        self._counts: Counter[tuple[str, str]] = Counter()
        self._count_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_logs = threading.Event()
        self.exemplars = exemplars
        window = settings.export_interval_seconds
        self.events = RegressionEvents(
            store, self.resource, host=host, external_url=external_url, wake=self._wake_logs.set, clock=clock,
            # The window that opened the episode began up to one interval before it.
            exemplars=(lambda reg: exemplars.trace_ids(reg.target, reg.opened_at - window, reg.closed_at))
            if exemplars is not None else None)
        self._threads = [threading.Thread(target=self._metrics_loop, name="otlp-metrics", daemon=True),
                         threading.Thread(target=self._logs_loop, name="otlp-logs", daemon=True)]
        if exemplars is not None:
            self._threads.append(threading.Thread(target=self._exemplars_loop, name="otlp-exemplars", daemon=True))

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        for t in self._threads:
            t.start()
        log.info("otlp: exporting to %s every %g s", self.settings.safe_endpoint,
                 self.settings.export_interval_seconds)

    def stop(self) -> None:
        """One last metrics export (the final totals), then stop; each thread has at most one request in flight,
        which its deadline bounds."""
        self._stop.set()
        self._wake_logs.set()
        for t in self._threads:
            if t.is_alive():
                t.join(self.settings.timeout_seconds + 5)

    # ---- metrics -----------------------------------------------------------------------------------------------

    def export_metrics(self) -> PostResult:
        """Read the registry /metrics reads, and post it as one OTLP request."""
        now_ns = int(self._clock() * 1e9)
        data = otlp_metrics.metrics_data(self._registry.collect(), self.resource, start_ns=self._start_ns,
                                         now_ns=now_ns)
        result = self._post("metrics", otlp_metrics.encode(data))
        self._count("metrics", "sent" if result.accepted else "failed")
        if not result.accepted:
            self._metrics_failing = True
            self._on_error("otlp")
            log.info("otlp: metrics export failed (%s); the next export carries the totals", result.error)
        elif self._metrics_failing:
            self._metrics_failing = False
            self._retry_records_now()
        return result

    def _retry_records_now(self) -> None:
        """The Collector answers again: records waiting out their backoff (up to backoff_max_seconds after a long
        outage) are due now, so what opened during the outage arrives within an interval of its end."""
        with self._outbox.store.transaction() as conn:
            n = conn.execute("UPDATE alert_notifications SET next_attempt_at = ? WHERE receiver = ? AND owner = ? "
                             "AND state = 'pending'", (self._clock(), OUTBOX_RECEIVER, AGENT_OWNER)).rowcount
        if n:
            log.info("otlp: the Collector answers again; %d regression record(s) due now", n)
            self._wake_logs.set()

    def _metrics_loop(self) -> None:
        interval = self.settings.export_interval_seconds
        deadline = time.monotonic() + interval
        while not self._stop.wait(max(0.0, deadline - time.monotonic())):
            # Fixed steps from the start, skipping any a slow export overran: exports never bunch up.
            deadline += interval * max(1, int((time.monotonic() - deadline) // interval) + 1)
            self._guarded(self.export_metrics)
        self._guarded(self.export_metrics)

    def _exemplars_loop(self) -> None:
        assert self.exemplars is not None
        while not self._stop.wait(self.settings.export_interval_seconds):
            self._guarded(self.exemplars.poll)

    # ---- log records -------------------------------------------------------------------------------------------

    def deliver_logs(self) -> bool:
        """Expire what is too old, then attempt the next due record; True when an attempt was made."""
        now = self._clock()
        expired = self._outbox.expire(OUTBOX_RECEIVER, AGENT_OWNER, now, self._alerts.retry_max_age_seconds)
        if expired:
            self._count("logs", "expired", expired)
            log.warning("otlp: %d regression record(s) expired after %g s of retries", expired,
                        self._alerts.retry_max_age_seconds)
        n = self._outbox.next_due(OUTBOX_RECEIVER, AGENT_OWNER, now)
        if n is None:
            return False
        result = self._post("logs", n.body)
        now = self._clock()
        error = result.error[:MAX_ERROR_CHARS] if result.error else None
        if result.accepted:
            self._outbox.record(n.id, state="sent", now=now, http_status=result.status, error=None)
            self._count("logs", "sent")
        elif result.retryable:
            delay = backoff_seconds(n.attempts + 1, self._alerts, self._rng)
            self._outbox.record(n.id, state="pending", now=now, http_status=result.status, error=error,
                                next_attempt_at=now + delay)
            self._count("logs", "retried")
            self._on_error("otlp")
            log.info("otlp: regression record not delivered (%s); retry in %.1f s", error, delay)
        else:
            self._outbox.record(n.id, state="failed", now=now, http_status=result.status, error=error)
            self._count("logs", "failed")
            self._on_error("otlp")
            log.warning("otlp: regression record refused for good (%s)", error)
        return True

    def _logs_loop(self) -> None:
        while not self._stop.is_set():
            wait = IDLE_POLL_SECONDS
            try:
                if self.deliver_logs():
                    continue
                wakeup = self._outbox.next_wakeup(OUTBOX_RECEIVER, AGENT_OWNER)
                if wakeup is not None:
                    wait = min(IDLE_POLL_SECONDS, max(0.0, wakeup - self._clock()))
            except Exception:
                # A store hiccup must not end delivery: counted and logged, then retried after a pause.
                self._on_error("otlp")
                log.exception("otlp: regression record delivery failed")
            self._wake_logs.wait(wait)
            self._wake_logs.clear()

    # ---- shared ------------------------------------------------------------------------------------------------

    def _post(self, signal: str, body: bytes) -> PostResult:
        headers = {**self.settings.headers, "Content-Type": CONTENT_TYPE, "User-Agent": USER_AGENT}
        return post(self.settings.url(signal), body, headers, timeout=self.settings.timeout_seconds,
                    safe_url=self.settings.safe_endpoint)

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:  # a bug in one export must not end the thread: counted and logged, next one tries again
            self._on_error("otlp")
            log.exception("otlp: export failed")

    def _count(self, signal: str, outcome: str, n: int = 1) -> None:
        with self._count_lock:
            self._counts[(signal, outcome)] += n

    def counts(self) -> dict[tuple[str, str], int]:
        with self._count_lock:
            return dict(self._counts)

    def pending_records(self) -> int:
        rows = self._outbox.store.query("SELECT COUNT(*) FROM alert_notifications WHERE receiver = ? AND "
                                        "owner = ? AND state = 'pending'", (OUTBOX_RECEIVER, AGENT_OWNER))
        return int(rows[0][0])

    def collector(self) -> OtlpCollector:
        return OtlpCollector(self)


class OtlpCollector(Collector):
    """The export's own health on /metrics (and so over OTLP too)."""

    def __init__(self, exporter: OtlpExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        exports = CounterMetricFamily("infersight_otlp_exports",
                                      "OTLP requests by signal (metrics, logs) and outcome (sent; failed: not "
                                      "accepted; for logs also retried, expired).", labels=["signal", "outcome"])
        for (signal, outcome), n in sorted(self._exporter.counts().items()):
            exports.add_metric([signal, outcome], n)
        pending = GaugeMetricFamily("infersight_otlp_pending_records",
                                    "Regression records queued in the outbox, not yet accepted by the Collector.")
        pending.add_metric([], self._exporter.pending_records())
        yield from (exports, pending)
