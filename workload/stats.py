"""Percentiles and the load summary record."""

import math
from dataclasses import asdict, dataclass


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in 0..100, got {q!r}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Summary:
    """What one load run measured; latencies in seconds."""

    duration_s: float
    sent: int
    ok: int
    errors: dict[str, int]
    throughput_rps: float
    tokens_per_s: float
    latency_p50: float
    latency_p95: float
    latency_p99: float
    ttft_p50: float
    ttft_p95: float
    ttft_p99: float

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (f"requests {self.sent} sent, {self.ok} ok in {self.duration_s:.1f}s; errors: {errs}\n"
                f"throughput {self.throughput_rps:.2f} req/s, {self.tokens_per_s:.1f} tokens/s\n"
                f"latency p50 {self.latency_p50 * 1000:.1f} ms  p95 {self.latency_p95 * 1000:.1f} ms  "
                f"p99 {self.latency_p99 * 1000:.1f} ms\n"
                f"ttft    p50 {self.ttft_p50 * 1000:.1f} ms  p95 {self.ttft_p95 * 1000:.1f} ms  "
                f"p99 {self.ttft_p99 * 1000:.1f} ms")
