"""Every family /metrics exports goes over OTLP with the same values, under the documented names."""

from __future__ import annotations

import re
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import build_registry
from agent.otlp.metrics import NAMES, metrics_data, otlp_name
from agent.state import AgentState
from tests.agent.otlp.receiver import decode, prometheus_samples, prometheus_view
from tests.dashboards.conftest import make_bare_window, make_window

DOCS = Path(__file__).resolve().parents[3] / "docs" / "otlp.md"


def _state() -> AgentState:
    state = AgentState()
    state.record_window(make_window(target="server", start=1000.0, end=1005.0))
    state.record_window(make_window(target="server", start=1005.0, end=1010.0))
    state.record_window(make_bare_window(target="native", start=1000.0, end=1005.0))
    state.count_error("otlp")
    return state


def _points(registry) -> list[dict]:
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics

    data = metrics_data(registry.collect(), Resource({"service.name": "infersight", "host.name": "h1"}),
                        start_ns=1, now_ns=2)
    doc = decode("/v1/metrics", encode_metrics(data).SerializeToString())
    out = []
    for rm in doc["resource_metrics"]:
        resource = {kv["key"]: kv["value"].get("string_value") for kv in rm["resource"]["attributes"]}
        for sm in rm["scope_metrics"]:
            for m in sm["metrics"]:
                kind = next(k for k in ("sum", "gauge", "histogram") if k in m)
                for p in m[kind]["data_points"]:
                    out.append({"resource": resource, "name": m["name"], "unit": m.get("unit", ""), "kind": kind,
                                "attrs": {kv["key"]: kv["value"]["string_value"] for kv in p.get("attributes", [])},
                                "point": p, "monotonic": m[kind].get("is_monotonic", False)})
    return out


def test_every_sample_of_metrics_arrives_over_otlp_with_the_same_value() -> None:
    registry = build_registry(_state())
    # Frozen process figures: the agent's own CPU and memory move between two reads of the registry.
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    points = _points(registry)
    want = prometheus_samples(families)
    got = prometheus_view(points, families)
    moving = {"infersight_agent_cpu_seconds_total", "infersight_agent_resident_memory_bytes",
              "infersight_agent_peak_resident_memory_bytes", "infersight_agent_uptime_seconds",
              "infersight_agent_children_cpu_seconds_total"}
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if k[0] not in moving} == {k: v for k, v in want.items()
                                                                     if k[0] not in moving}
    # The syscalls, off-CPU, GC pause histogram, retransmits, run-queue, CPU and latency quantiles are among them.
    names = {k[0] for k in want}
    assert {"infersight_syscalls_total", "infersight_offcpu_seconds_total", "infersight_gc_pause_seconds_bucket",
            "infersight_tcp_retransmits_total", "infersight_runqueue_latency_seconds_bucket",
            "infersight_process_cpu_seconds_total", "infersight_request_latency_seconds"} <= names


def test_semantic_convention_names_units_and_resources() -> None:
    points = _points(build_registry(_state()))
    cpu = [p for p in points if p["name"] == "process.cpu.time"]
    assert {p["resource"].get("infersight.target") for p in cpu} == {None, "server", "native"}
    assert all(p["unit"] == "s" and p["kind"] == "sum" and p["monotonic"] for p in cpu)
    rss = [p for p in points if p["name"] == "process.memory.usage"]
    assert rss and all(p["unit"] == "By" and p["kind"] == "sum" and not p["monotonic"] for p in rss)
    server = next(p for p in cpu if p["resource"].get("infersight.target") == "server")
    assert server["resource"]["service.instance.id"] == "h1/server"
    assert server["resource"]["service.name"] == "infersight" and server["attrs"] == {"target": "server"}
    latency = [p for p in points if p["name"] == "infersight.request.latency"]
    assert {p["attrs"]["percentile"] for p in latency} == {"p50", "p95", "p99"}
    gc = next(p for p in points if p["name"] == "infersight.gc.pause.duration")
    assert gc["kind"] == "histogram" and gc["unit"] == "s"
    errors = {p["attrs"]["component"]: float(p["point"].get("as_double", p["point"].get("as_int", 0))) for p in points
              if p["name"] == "infersight.agent.errors"}
    assert errors["otlp"] == 1


def test_the_docs_table_names_every_family_as_the_code_does() -> None:
    from agent.detection import DetectionSnapshot
    from agent.detection_metrics import DetectionCollector

    registry = build_registry(_state())
    registry.register(DetectionCollector(lambda: DetectionSnapshot(findings={}, opened={})))
    rows = dict(re.findall(r"^\| `(infersight_[a-z_]+)` \| `([a-z_.]+)` \|", DOCS.read_text(), re.M))
    families = {f.name: f.type for f in registry.collect()}
    assert set(NAMES) <= set(rows)
    missing = sorted(set(families) - set(rows))
    assert missing == [], f"docs/otlp.md lacks {missing}"
    assert {n: rows[n] for n in families} == {n: otlp_name(n, t).name for n, t in families.items()}
