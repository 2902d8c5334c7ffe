"""A real OTLP/HTTP receiver on loopback for the tests: it decodes each request with opentelemetry-proto's
generated classes (the protobuf schema the Collector uses) and keeps what arrived, or answers as told."""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.agent.alerts.conftest import Receiver

REQUESTS = {"/v1/metrics": ExportMetricsServiceRequest, "/v1/logs": ExportLogsServiceRequest,
            "/v1/traces": ExportTraceServiceRequest}


def decode(path: str, body: bytes) -> dict:
    msg = REQUESTS[path]()
    msg.ParseFromString(body)
    return MessageToDict(msg, preserving_proto_field_name=True)


@dataclass
class OtlpReceiver(Receiver):
    """Receiver (tests/agent/alerts/conftest.py) whose accepted bodies are read as OTLP."""

    answer: object = field(default=None)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def docs(self, path: str, arrivals: list | None = None) -> list[dict]:
        return [decode(a.path, a.body) for a in (self.accepted() if arrivals is None else arrivals)
                if a.path == path]

    def metric_points(self, arrivals: list | None = None) -> list[dict]:
        """Every data point of the accepted metrics requests (or of `arrivals`), flattened: resource attrs, name,
        kind, point."""
        out = []
        for doc in self.docs("/v1/metrics", arrivals):
            for rm in doc["resource_metrics"]:
                resource = attrs(rm["resource"].get("attributes", []))
                for sm in rm["scope_metrics"]:
                    for m in sm["metrics"]:
                        kind = next(k for k in ("sum", "gauge", "histogram") if k in m)
                        for p in m[kind]["data_points"]:
                            out.append({"resource": resource, "name": m["name"], "unit": m.get("unit", ""),
                                        "kind": kind, "monotonic": m[kind].get("is_monotonic", False),
                                        "attrs": attrs(p.get("attributes", [])), "point": p})
        return out

    def log_records(self) -> list[dict]:
        out = []
        for doc in self.docs("/v1/logs"):
            for rl in doc["resource_logs"]:
                resource = attrs(rl["resource"].get("attributes", []))
                for sl in rl["scope_logs"]:
                    for r in sl["log_records"]:
                        out.append({"resource": resource, "event": r.get("event_name"),
                                    "severity": r.get("severity_text"), "body": value(r.get("body", {})),
                                    "attrs": attrs(r.get("attributes", []))})
        return out


def value(v: dict):
    if "array_value" in v:
        return [value(x) for x in v["array_value"].get("values", [])]
    for k in ("string_value", "bool_value", "double_value"):
        if k in v:
            return v[k]
    if "int_value" in v:
        return int(v["int_value"])
    return None


def attrs(kvs: list[dict]) -> dict:
    return {kv["key"]: value(kv["value"]) for kv in kvs}


def prometheus_view(points: list[dict], families) -> dict[tuple[str, tuple], float]:
    """The OTLP points written back as the Prometheus samples they came from, (sample name, labels) -> value,
    for the families given (parsed from /metrics): so a test compares the two exports sample by sample."""
    from agent.otlp.metrics import otlp_name

    by_name: dict[str, list[dict]] = {}
    for p in points:
        by_name.setdefault(p["name"], []).append(p)
    out: dict[tuple[str, tuple], float] = {}
    for fam in families:
        name = otlp_name(fam.name, fam.type)
        for p in by_name.get(name.name, []):
            # The agent's own process.* and a target's share a name: the resource tells them apart.
            if ("target" in p["attrs"]) != ("infersight.target" in p["resource"]):
                continue
            if name.semconv and fam.name.startswith("infersight_agent_") == ("infersight.target" in p["resource"]):
                continue
            labels = tuple(sorted(p["attrs"].items()))
            point = p["point"]
            if p["kind"] == "histogram":
                running = 0
                bounds = point.get("explicit_bounds", [])
                counts = [int(c) for c in point.get("bucket_counts", [])]
                for i, c in enumerate(counts):
                    running += c
                    le = repr(float(bounds[i])) if i < len(bounds) else "+Inf"
                    out[(f"{fam.name}_bucket", tuple(sorted({**p["attrs"], "le": le}.items())))] = running
                out[(f"{fam.name}_count", labels)] = int(point.get("count", 0))
                out[(f"{fam.name}_sum", labels)] = float(point.get("sum", 0.0))
            else:
                v = point.get("as_double", point.get("as_int", 0))
                out[(f"{fam.name}_total" if fam.type == "counter" else fam.name, labels)] = float(v)
    return out


def prometheus_samples(families) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for fam in families for s in fam.samples if not s.name.endswith("_created")}


def spans(receiver: OtlpReceiver) -> list[dict]:
    """Every span of every accepted traces request: ids as hex, attributes as a dict, the service's name."""
    import base64

    def hexid(b64: str | None) -> str:
        return base64.b64decode(b64).hex() if b64 else ""

    out = []
    for doc in receiver.docs("/v1/traces"):
        for rs in doc["resource_spans"]:
            service = attrs(rs["resource"].get("attributes", [])).get("service.name")
            for ss in rs["scope_spans"]:
                for s in ss["spans"]:
                    out.append({"service": service, "name": s["name"], "kind": s.get("kind"),
                                "trace_id": hexid(s.get("trace_id")), "span_id": hexid(s.get("span_id")),
                                "parent": hexid(s.get("parent_span_id")), "attrs": attrs(s.get("attributes", [])),
                                "start": int(s["start_time_unix_nano"]), "end": int(s["end_time_unix_nano"])})
    return out
