"""Prometheus series for alert delivery: outcomes by receiver and status, and each receiver's outbox backlog."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.alerts.delivery import DeliveryCounters
from agent.store.alerts import Outbox

OUTCOMES = ("sent", "failed", "expired", "retried")


class AlertCollector(Collector):
    """Reads the delivery counters and the outbox at scrape time (two small indexed queries per receiver)."""

    def __init__(self, counters: DeliveryCounters, outbox: Outbox, receivers: list[str],
                 clock: Callable[[], float] = time.time) -> None:
        self._counters = counters
        self._outbox = outbox
        self._receivers = receivers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        counts = self._counters.snapshot()
        total = CounterMetricFamily("infersight_alert_notifications",
                                    "Alert notification outcomes since the agent started: sent, failed (refused "
                                    "for good), expired (past retry_max_age), retried (an attempt to retry).",
                                    labels=["receiver", "status"])
        for receiver in self._receivers:
            for status in OUTCOMES:
                total.add_metric([receiver, status], counts.get((receiver, status), 0))
        pending = GaugeMetricFamily("infersight_alert_outbox_pending", "Notifications waiting in the outbox.",
                                    labels=["receiver"])
        oldest = GaugeMetricFamily("infersight_alert_outbox_oldest_seconds",
                                   "Age of the oldest notification waiting in the outbox (0 when none wait).",
                                   labels=["receiver"])
        now = self._clock()
        for s in self._outbox.summaries(self._receivers):
            if s.receiver not in self._receivers:
                continue
            pending.add_metric([s.receiver], s.counts["pending"])
            oldest.add_metric([s.receiver], 0.0 if s.oldest_pending_at is None else max(0.0, now - s.oldest_pending_at))
        yield from (total, pending, oldest)
