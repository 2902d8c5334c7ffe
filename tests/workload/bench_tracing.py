"""Measure what `serve --otlp-endpoint` adds per completion: the `llm_request` span and its three children made,
ended and exported (the SDK's BatchSpanProcessor, OTLP/HTTP protobuf) to a real OTLP receiver in another process.
CPU time of this process only, so a loaded machine does not inflate it.

Run: `.venv/bin/python -m tests.workload.bench_tracing --requests 2000`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from tests.agent.alerts.conftest import free_port
from workload.tracing import ServerTracing, Timings, provider

RECEIVER = """
import sys
from tests.agent.otlp.receiver import OtlpReceiver
OtlpReceiver(port=int(sys.argv[1])).start()
print("ready", flush=True)
sys.stdin.read()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        tracer_provider = provider(f"http://127.0.0.1:{port}", "workload")
        tracing = ServerTracing(tracer_provider, "infersight-tiny")
        headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        cpu0 = time.process_time()
        for i in range(args.requests):
            now = time.monotonic()
            span = tracing.start(headers, now - 0.2, f"cmpl-{i}", 32, 0.8)
            tracing.finish(span, Timings(now - 0.2, now - 0.19, now - 0.15, now, [4] * 32, 40, 32, "length"))
            if i % 200 == 199:
                # Far faster than a server completes requests: flush so no span is dropped from the queue.
                tracer_provider.force_flush()
        tracing.shutdown()  # flushes the queue: every span's export is counted
        cpu = (time.process_time() - cpu0) / args.requests
        print(json.dumps({"requests": args.requests, "cpu_ms_per_request": round(cpu * 1e3, 3)}))
    finally:
        receiver.stdin.close()  # type: ignore[union-attr]
        receiver.wait(10)


if __name__ == "__main__":
    main()
