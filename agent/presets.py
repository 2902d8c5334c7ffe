"""Latency source presets: where known inference servers publish request latency, and in what shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "histogram": a Prometheus histogram family (<metric>_bucket/_sum/_count); quantiles come from bucket deltas.
# "counter": a cumulative-duration counter plus a request counter; only the mean latency is derivable.
LatencyKind = Literal["histogram", "counter"]
LATENCY_KINDS: tuple[str, ...] = ("histogram", "counter")


@dataclass(frozen=True)
class LatencyPreset:
    name: str
    url: str
    metric: str
    kind: LatencyKind
    # Multiply the metric's values by this to get seconds (Triton reports microseconds).
    unit_seconds: float
    # For kind "counter": the counter of completed requests that divides the duration counter.
    count_metric: str | None
    summary: str


PRESETS: dict[str, LatencyPreset] = {
    p.name: p
    for p in (
        LatencyPreset(
            name="workload",
            url="http://127.0.0.1:8000/metrics",
            metric="vllm:e2e_request_latency_seconds",
            kind="histogram",
            unit_seconds=1.0,
            count_metric=None,
            summary="the bundled PyTorch server; it exports vLLM's metric names on port 8000",
        ),
        LatencyPreset(
            name="vllm",
            url="http://127.0.0.1:8000/metrics",
            metric="vllm:e2e_request_latency_seconds",
            kind="histogram",
            unit_seconds=1.0,
            count_metric=None,
            summary="vLLM's OpenAI-compatible server: end-to-end request latency histogram, seconds",
        ),
        LatencyPreset(
            name="tgi",
            url="http://127.0.0.1:3000/metrics",
            metric="tgi_request_duration",
            kind="histogram",
            unit_seconds=1.0,
            count_metric=None,
            summary="Hugging Face text-generation-inference: request duration histogram, seconds "
            "(launcher's default port 3000; the Docker image listens on 80)",
        ),
        LatencyPreset(
            name="triton",
            url="http://127.0.0.1:8002/metrics",
            metric="nv_inference_request_duration_us",
            kind="counter",
            unit_seconds=1e-6,
            count_metric="nv_inference_request_success",
            summary="NVIDIA Triton: cumulative request duration counter (microseconds) / successful "
            "requests; mean latency only, no p50/p95/p99",
        ),
    )
}

DEFAULT_PRESET = "workload"
