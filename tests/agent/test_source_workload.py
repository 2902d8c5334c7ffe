"""All four user-space sources on the bundled inference server under real load."""

from __future__ import annotations

import pytest

from agent.sources.gpu import GpuSource
from agent.sources.latency import LatencySource
from agent.sources.process import ProcessSource
from agent.sources.pyspy import PySpySampler
from workload.launch import launched_server
from workload.loadgen import LoadSpec, Phase, run_load

pytestmark = [pytest.mark.slow, pytest.mark.workload]


def test_sources_read_the_workload(require_root) -> None:
    with launched_server() as srv:
        # Full rate in 1 s segments: the 6 s of load must hold finished segments with busy threads in them
        # (the always-on default, 3 Hz in 5 s segments, may have none finished yet).
        sampler = PySpySampler(srv.proc.pid, rate_hz=49, segment_seconds=1)
        latency = LatencySource(srv.url + "/metrics", "vllm:e2e_request_latency_seconds")
        process = ProcessSource(srv.proc.pid)
        gpu = GpuSource(srv.proc.pid)
        try:
            latency.prime()
            sampler.read()
            result = run_load(srv.url, LoadSpec(phases=(Phase(rate=3.0, duration_s=6.0),), seed=3))
            ok = [o.result for o in result.outcomes if o.result.ok]
            assert ok, "the load produced no successful request"

            lat = latency.read()
            # Ground truth: the client's own count of completed requests in the same interval.
            assert lat.requests == len(ok)
            assert 0 < lat.p50_seconds <= lat.p95_seconds <= lat.p99_seconds
            assert lat.p50_seconds <= max(r.latency_s for r in ok) * 1.5

            proc = process.read()
            assert proc.cpu_seconds > 0.2 and proc.threads >= 32 and proc.rss_bytes > 100 * 2**20

            stacks = sampler.read()
            assert any("workload/" in s for s in stacks.active), list(stacks.active)[:5]
            assert any(s.startswith("waitress") and "wait" in s for s in stacks.idle), list(stacks.idle)[:5]
            assert sampler.health().errors == 0, sampler.health()

            g = gpu.read()
            assert g.available or g.reason.startswith("no NVIDIA GPU")
        finally:
            for src in (sampler, latency, process, gpu):
                src.close()
