"""vLLM's queue / prefill / decode histograms: one observation per finished request, adding up to its e2e time."""

import re
import urllib.request

import pytest

from tests.workload.test_workload_faults import burst

pytestmark = pytest.mark.workload


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time"):
        for part in ("sum", "count"):
            m = re.search(rf"^vllm:{name}_seconds_{part}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
            assert m, f"vllm:{name}_seconds_{part} missing"
            out[f"{name}_{part}"] = float(m.group(1))
    return out


def test_phase_histograms_split_each_request(server) -> None:
    before = scrape(server.url)
    burst(server.url, requests=4, tokens=12)
    after = scrape(server.url)
    d = {k: after[k] - before[k] for k in after}
    assert d["e2e_request_latency_count"] == 4
    for name in ("request_queue_time", "request_prefill_time", "request_decode_time"):
        assert d[f"{name}_count"] == 4 and d[f"{name}_sum"] >= 0
    parts = d["request_queue_time_sum"] + d["request_prefill_time_sum"] + d["request_decode_time_sum"]
    assert parts == pytest.approx(d["e2e_request_latency_sum"], rel=1e-6)
    assert d["request_decode_time_sum"] > d["request_prefill_time_sum"]  # 11 decode steps vs one prefill
