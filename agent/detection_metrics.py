"""Prometheus series of the detector's findings: regression state, score, episodes and expected latency."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.detection import DetectionSnapshot


class DetectionCollector(Collector):
    def __init__(self, snapshot: Callable[[], DetectionSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        active = GaugeMetricFamily("infersight_regression_active",
                                   "1 while a latency regression is open on the target, else 0.", labels=["target"])
        score = GaugeMetricFamily("infersight_regression_score",
                                  "The detector's anomaly score of the target's latest window (absent in warm-up).",
                                  labels=["target"])
        armed = GaugeMetricFamily("infersight_detector_armed",
                                  "1 once the target's baseline is learned (warm-up over), else 0.", labels=["target"])
        # `percentile`, not `quantile`: that label belongs to summaries (promtool check metrics).
        expected = GaugeMetricFamily("infersight_latency_expected_seconds",
                                     "Request latency the baseline expects at the current load.",
                                     labels=["target", "percentile"])
        opened = CounterMetricFamily("infersight_regressions",
                                     "Latency regressions opened since the agent started, by top cause at opening.",
                                     labels=["target", "cause"])
        for name, f in sorted(snap.findings.items()):
            active.add_metric([name], 1.0 if f.regression is not None else 0.0)
            armed.add_metric([name], 0.0 if f.state == "warmup" else 1.0)
            if f.score is not None:
                score.add_metric([name], f.score)
            for q, seconds in sorted(f.expected.items()):
                expected.add_metric([name, q], seconds)
        for (name, cause), n in sorted(snap.opened.items()):
            opened.add_metric([name, cause], n)
        yield from (active, score, armed, expected, opened)
