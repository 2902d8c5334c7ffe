"""Exemplar trace ids from a target's OpenMetrics answer: only hex trace ids, bounded, slowest first in a range."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.otlp.exemplars import MAX_KEPT, ExemplarWatch, parse_exemplars

A, B, C = "a" * 32, "b" * 32, "c" * 32
BODY = f"""# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="0.1",model_name="m"}} 3.0 # {{trace_id="{A}"}} 0.05 1000.5
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="m"}} 5.0 # {{trace_id="{B}"}} 0.9 1002.0
vllm:e2e_request_latency_seconds_bucket{{le="5.0",model_name="m"}} 6.0 # {{trace_id="{C}"}} 4.2 1010.0
vllm:e2e_request_latency_seconds_bucket{{le="10.0",model_name="m"}} 6.0 # {{trace_id="not-hex"}} 7.0 1003.0
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} 6.0
vllm:e2e_request_latency_seconds_count{{model_name="m"}} 6.0
# EOF
"""


class _Handler(BaseHTTPRequestHandler):
    accepts: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Handler.accepts.append(self.headers.get("Accept", ""))
        data = BODY.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_parse_keeps_only_hex_trace_ids_with_value_and_time() -> None:
    found = parse_exemplars(BODY, "vllm:e2e_request_latency_seconds_bucket", now=0.0)
    assert [(e.trace_id, e.value_seconds, e.at) for e in found] == [(A, 0.05, 1000.5), (B, 0.9, 1002.0),
                                                                    (C, 4.2, 1010.0)]


def test_watch_asks_for_openmetrics_and_picks_the_slowest_in_the_episode() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        watch = ExemplarWatch([("workload", url, "vllm:e2e_request_latency_seconds", 2.0)], clock=lambda: 1020.0)
        watch.poll()
        watch.poll()  # the same exemplars again: kept once
        assert _Handler.accepts[0].startswith("application/openmetrics-text")
        assert watch.trace_ids("workload", since=1001.0, until=None) == [C, B]
        assert watch.trace_ids("workload#4242", since=1001.0, until=1005.0) == [B]
        assert watch.trace_ids("other", since=0, until=None) == []
        assert watch.trace_ids("workload", since=0, until=None, n=1) == [C]
        assert len(watch._kept["workload"]) == 3 <= MAX_KEPT
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_target_costs_only_its_exemplars() -> None:
    watch = ExemplarWatch([("workload", "http://127.0.0.1:9/metrics", "m", 1.0)])
    watch.poll()
    assert watch.trace_ids("workload", since=0, until=None) == []
