"""Every family /metrics exports, as OTLP metrics with the same values: read from the same Prometheus registry at
export time, renamed (docs/otlp.md has the table) and encoded by the OpenTelemetry SDK's own encoder."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromMetric

# The OpenTelemetry Semantic Conventions release whose names are used (opentelemetry-semantic-conventions 0.66b2).
SEMCONV_VERSION = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = InstrumentationScope("infersight", schema_url=SCHEMA_URL)


@dataclass(frozen=True)
class OtlpName:
    """What one Prometheus family is called over OTLP. `updown`: a gauge the conventions define as an
    UpDownCounter (a non-monotonic cumulative sum), such as process.memory.usage."""

    name: str
    unit: str
    semconv: bool = False
    updown: bool = False


# Families with a Semantic Conventions name, or whose mechanical name (infersight_a_b -> infersight.a_b) would
# mislead. The target's process figures sit in that target's resource, the agent's own in the agent's, so the
# same convention name describes one process in each.
NAMES: Mapping[str, OtlpName] = {
    "infersight_process_cpu_seconds": OtlpName("process.cpu.time", "s", semconv=True),
    "infersight_process_resident_memory_bytes": OtlpName("process.memory.usage", "By", semconv=True, updown=True),
    "infersight_process_threads": OtlpName("process.thread.count", "{thread}", semconv=True, updown=True),
    "infersight_agent_cpu_seconds": OtlpName("process.cpu.time", "s", semconv=True),
    "infersight_agent_resident_memory_bytes": OtlpName("process.memory.usage", "By", semconv=True, updown=True),
    "infersight_agent_uptime_seconds": OtlpName("process.uptime", "s", semconv=True),
    "infersight_syscalls": OtlpName("infersight.syscalls", "{call}"),
    "infersight_offcpu_seconds": OtlpName("infersight.offcpu.time", "s"),
    "infersight_gc_collections": OtlpName("infersight.gc.collections", "{collection}"),
    "infersight_gc_pause_seconds": OtlpName("infersight.gc.pause.duration", "s"),
    "infersight_runqueue_latency_seconds": OtlpName("infersight.runqueue.latency", "s"),
    "infersight_tcp_retransmits": OtlpName("infersight.tcp.retransmits", "{segment}"),
    "infersight_host_tcp_retransmits": OtlpName("infersight.host.tcp.retransmits", "{segment}"),
    "infersight_requests": OtlpName("infersight.requests", "{request}"),
    "infersight_request_latency_seconds": OtlpName("infersight.request.latency", "s"),
    "infersight_request_rate_per_second": OtlpName("infersight.request.rate", "{request}/s"),
    "infersight_client_latency_seconds": OtlpName("infersight.client.latency", "s"),
    "infersight_latency_expected_seconds": OtlpName("infersight.latency.expected", "s"),
    "infersight_regression_score": OtlpName("infersight.regression.score", "1"),
}


def otlp_name(prom_name: str, prom_type: str) -> OtlpName:
    """The OTLP name of a Prometheus family: from NAMES, else mechanically (infersight_agent_late_ticks ->
    infersight.agent.late_ticks: the first word after the prefix becomes a namespace, the rest stays whole, so
    every family the agent gains later is exported too, under a predictable name)."""
    if prom_name in NAMES:
        return NAMES[prom_name]
    rest = prom_name.removeprefix("infersight_")
    unit = "1"
    for suffix, u in (("_seconds", "s"), ("_bytes", "By")):
        if rest.endswith(suffix):
            rest, unit = rest.removesuffix(suffix), u
    head, _, tail = rest.partition("_")
    name = f"infersight.{head}.{tail}" if tail else f"infersight.{head}"
    if unit == "1" and prom_type == "counter":
        unit = "{event}"
    return OtlpName(name, unit)


def _attrs(labels: Mapping[str, str], drop: Iterable[str] = ()) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in drop}


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _points(family: PromMetric, start_ns: int, now_ns: int) -> list[tuple[str | None, object]]:
    """(target or None, data point) for each series of the family."""
    out: list[tuple[str | None, object]] = []
    if family.type == "histogram":
        series: dict[tuple, dict] = defaultdict(lambda: {"buckets": []})
        for s in family.samples:
            labels = _attrs(s.labels, ("le",))
            entry = series[_key(labels)]
            entry["labels"] = labels
            if s.name.endswith("_bucket"):
                entry["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                entry["sum"] = s.value
            elif s.name.endswith("_count"):
                entry["count"] = s.value
        for entry in series.values():
            buckets = sorted(entry["buckets"])
            cumulative = [int(c) for _, c in buckets]
            counts = [b - a for a, b in zip([0, *cumulative[:-1]], cumulative, strict=True)]
            bounds = [le for le, _ in buckets if not math.isinf(le)]
            labels = entry["labels"]
            out.append((labels.get("target"), HistogramDataPoint(
                attributes=labels, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                count=int(entry.get("count", cumulative[-1] if cumulative else 0)), sum=entry.get("sum", 0.0),
                bucket_counts=counts, explicit_bounds=bounds, min=None, max=None)))
        return out
    for s in family.samples:
        # prometheus_client adds `_created` beside a counter's `_total`: when the series began, not a figure.
        if s.name.endswith("_created"):
            continue
        out.append((s.labels.get("target"), NumberDataPoint(
            attributes=dict(s.labels), start_time_unix_nano=start_ns, time_unix_nano=now_ns, value=s.value)))
    return out


def _metric(name: OtlpName, prom: PromMetric, points: list) -> Metric:
    data: Sum | Gauge | Histogram
    if prom.type == "histogram":
        data = Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE)
    elif prom.type == "counter":
        data = Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True)
    elif name.updown:
        data = Sum(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=False)
    else:
        data = Gauge(data_points=points)
    return Metric(name=name.name, description=prom.documentation, unit=name.unit, data=data)


def target_resource(base: Resource, target: str) -> Resource:
    return base.merge(Resource({"service.instance.id": f"{base.attributes.get('host.name', '')}/{target}",
                                "infersight.target": target}))


def metrics_data(families: Iterable[PromMetric], base: Resource, *, start_ns: int, now_ns: int) -> MetricsData:
    """One OTLP export of the families: series labelled with a `target` go to that target's resource (their
    `target` label kept as an attribute too), the rest to the agent's."""
    by_resource: dict[str | None, list[Metric]] = defaultdict(list)
    for family in families:
        name = otlp_name(family.name, family.type)
        grouped: dict[str | None, list] = defaultdict(list)
        for target, point in _points(family, start_ns, now_ns):
            grouped[target].append(point)
        for target, points in grouped.items():
            by_resource[target].append(_metric(name, family, points))
    resources = []
    for target, metrics in by_resource.items():
        resource = base if target is None else target_resource(base, target)
        resources.append(ResourceMetrics(resource=resource, schema_url=SCHEMA_URL, scope_metrics=[
            ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url=SCHEMA_URL)]))
    return MetricsData(resource_metrics=resources)


def encode(data: MetricsData) -> bytes:
    return encode_metrics(data).SerializeToString()
