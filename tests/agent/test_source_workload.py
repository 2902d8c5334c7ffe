"""All four user-space sources on the bundled inference server under real load."""

from __future__ import annotations

import contextlib

import pytest

from agent.sources.gpu import GpuSource
from agent.sources.latency import LatencySource
from agent.sources.process import ProcessSource
from agent.sources.pyspy import PySpySampler
from analysis.errors import ReadingError
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
            # Drop what was sampled before the load; a sampler this new may have nothing yet (no reading).
            with contextlib.suppress(ReadingError):
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
            assert sampler.health().error_count == 0, sampler.health()

            g = gpu.read()
            assert g.available or g.reason.startswith("no GPU on this host")
        finally:
            for src in (sampler, latency, process, gpu):
                src.close()


def test_latency_figures_of_the_workload_match_its_clients(require_root) -> None:
    from agent.presets import PRESETS

    with launched_server() as srv:
        latency = LatencySource(srv.url + "/metrics", "vllm:e2e_request_latency_seconds",
                                figures=PRESETS["workload"].figures)
        try:
            latency.prime()
            result = run_load(srv.url, LoadSpec(phases=(Phase(rate=3.0, duration_s=6.0),), seed=5))
            ok = [o.result for o in result.outcomes if o.result.ok]
            assert ok, "the load produced no successful request"
            lat = latency.read()
            assert lat.requests == len(ok) and sum(lat.buckets.values()) == len(ok)
            tokens = sum(len(r.token_ids) for r in ok)
            # Every token the clients got was generated in this interval (no other traffic).
            assert lat.tokens_per_second is not None and lat.tokens_per_second > 0
            assert lat.tokens_per_second * (result.duration_s + 1) >= tokens * 0.8, (lat.tokens_per_second, tokens)
            assert lat.waiting == 0.0 and lat.running == 0.0  # measured after the load drained
            # vLLM's split of a request: queue + prefill + decode is its end-to-end time, to the float.
            parts = lat.queue_mean_seconds + lat.prefill_mean_seconds + lat.decode_mean_seconds
            assert parts == pytest.approx(lat.mean_seconds, rel=1e-6)
            assert 0 < lat.ttft_mean_seconds <= lat.mean_seconds and 0 < lat.tpot_mean_seconds < lat.mean_seconds
        finally:
            latency.close()
