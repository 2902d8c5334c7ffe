"""Request traces: the load generator starts a trace per request, the server continues it with an `llm_request`
span and queue / prefill / decode children (vLLM's attribute names), exported over OTLP/HTTP to a real loopback
receiver; the e2e histogram carries the trace ids as OpenMetrics exemplars, which promtool accepts."""

from __future__ import annotations

import http.client
import re
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from tests.agent.alerts.conftest import wait_for
from tests.agent.otlp.receiver import OtlpReceiver, spans
from workload.client import complete
from workload.loadgen import LoadSpec, Phase, run_load
from workload.tracing import LoadTracing, provider

pytestmark = pytest.mark.workload
MALFORMED = "00-not-a-trace-id-0123456789abcdef-01"


def _get(url: str, path: str, accept: str | None = None) -> tuple[str, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        resp = conn.getresponse()
        return resp.getheader("Content-Type", ""), resp.read().decode()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    from tests.workload.conftest import start_server, stop_server

    receiver = OtlpReceiver().start()
    server = start_server(tmp_path_factory.mktemp("traced"), "--otlp-endpoint", receiver.endpoint)
    try:
        tracing = LoadTracing(provider(receiver.endpoint, "workload-loadgen"))
        result = run_load(server.url, LoadSpec((Phase(4.0, 1.5),), max_tokens=(4, 8), seed=3), tracing=tracing)
        tracing.shutdown()
        bad = complete(server.url, "hello", 3, headers={"traceparent": MALFORMED})
        assert bad.ok and all(o.result.ok for o in result.outcomes) and result.outcomes
        n = len(result.outcomes)
        # n client spans, n + 1 server spans with three children each.
        wait_for(lambda: len(spans(receiver)) >= n + 4 * (n + 1), timeout=30, what="every span")
        yield server, receiver, n
    finally:
        stop_server(server.proc)
        receiver.stop()


def test_each_completion_continues_the_loadgen_trace_with_three_children(traced) -> None:
    _, receiver, n = traced
    all_spans = spans(receiver)
    clients = [s for s in all_spans if s["service"] == "workload-loadgen"]
    assert len(clients) == n and all(s["kind"] == "SPAN_KIND_CLIENT" for s in clients)
    for client in clients:
        (server,) = [s for s in all_spans if s["name"] == "llm_request" and s["parent"] == client["span_id"]]
        assert server["trace_id"] == client["trace_id"] and server["kind"] == "SPAN_KIND_SERVER"
        children = {s["name"]: s for s in all_spans if s["parent"] == server["span_id"]}
        assert set(children) == {"queue", "prefill", "decode"}
        assert all(c["trace_id"] == server["trace_id"] for c in children.values())
        q, p, d = children["queue"], children["prefill"], children["decode"]
        assert server["start"] == q["start"] <= q["end"] == p["start"] <= p["end"] == d["start"] <= d["end"]
        assert d["end"] == server["end"]
        a = server["attrs"]
        assert a["gen_ai.request.model"] == "infersight-tiny" and a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.latency.time_in_queue"] == pytest.approx((q["end"] - q["start"]) / 1e9, abs=1e-6)
        assert a["gen_ai.latency.e2e"] == pytest.approx((server["end"] - server["start"]) / 1e9, abs=1e-6)
        assert a["gen_ai.response.finish_reasons"] == ["length"]
        tokens = a["gen_ai.usage.completion_tokens"]
        assert 4 <= tokens <= 8 and a["gen_ai.usage.prompt_tokens"] > 0
        # One batch size per decode step (the first token is the prefill's).
        assert len(d["attrs"]["workload.batch_sizes"]) == tokens - 1
        assert all(b >= 1 for b in d["attrs"]["workload.batch_sizes"]) and p["attrs"]["workload.batch_size"] >= 1


def test_a_malformed_traceparent_starts_a_new_trace(traced) -> None:
    _, receiver, _ = traced
    all_spans = spans(receiver)
    client_ids = {s["span_id"] for s in all_spans if s["service"] == "workload-loadgen"}
    roots = [s for s in all_spans if s["name"] == "llm_request" and s["parent"] not in client_ids]
    (root,) = roots
    assert root["parent"] == "" and re.fullmatch(r"[0-9a-f]{32}", root["trace_id"])
    assert root["trace_id"] != "0" * 32


def test_openmetrics_exemplars_name_the_traced_requests_and_pass_promtool(traced) -> None:
    server, receiver, _ = traced
    content_type, text = _get(server.url, "/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    exemplars = set(re.findall(r'^vllm:e2e_request_latency_seconds_bucket\{[^}]*\} \S+ # \{trace_id="([0-9a-f]{32})"\}',
                               text, re.M))
    traced_ids = {s["trace_id"] for s in spans(receiver) if s["name"] == "llm_request"}
    assert exemplars and exemplars <= traced_ids
    plain_type, plain = _get(server.url, "/metrics")
    assert plain_type.startswith("text/plain") and "trace_id" not in plain
    # promtool 2.42 (Debian 12) lints the text format only: the traced server's text answer stays clean. The
    # OpenMetrics answer goes through prometheus_client's strict OpenMetrics parser, exemplars included.
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (make setup installs it)"
    check = subprocess.run([promtool, "check", "metrics"], input=plain, capture_output=True, text=True, timeout=30)
    problems = [line for line in (check.stdout + check.stderr).splitlines() if not line.startswith("vllm:")]
    assert check.returncode in (0, 3) and problems == [], problems
    families = {f.name: f for f in openmetrics_families(text)}
    e2e = families["vllm:e2e_request_latency_seconds"]
    parsed = {s.exemplar.labels["trace_id"] for s in e2e.samples if s.exemplar is not None}
    assert parsed == exemplars


def test_otlp_endpoint_is_refused_with_the_engine_process_and_when_not_a_url(tmp_path) -> None:
    import sys

    for extra, message in ((["--engine-process"], "needs the single-process server"),
                           ([], "must be an http:// or https:// URL")):
        endpoint = "http://127.0.0.1:9" if extra else "collector:4318"
        out = subprocess.run([sys.executable, "-m", "workload", "serve", "--port", "0", "--otlp-endpoint", endpoint,
                              *extra], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
