"""Measure the CPU one OTLP metrics export costs the agent, and so the share of a core OTLP adds at a window
interval: the registry of `--targets` watched targets (each with the bundled workload's series) is read,
converted, encoded and posted to a real OTLP/HTTP receiver in another process (tests/agent/otlp/receiver.py),
`--exports` times. CPU time of this process only (the receiver's is the Collector's, not the agent's), so a
loaded machine does not inflate it.

Run: `.venv/bin/python -m tests.agent.bench_otlp --targets 4 --exports 200 --interval 5`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from agent.metrics import build_registry
from agent.otlp.config import OtlpConfig, settings
from agent.otlp.exporter import OtlpExporter
from agent.state import AgentState
from agent.store import Store
from tests.agent.alerts.conftest import free_port
from tests.dashboards.conftest import make_window

RECEIVER = """
import sys, time
from tests.agent.otlp.receiver import OtlpReceiver
r = OtlpReceiver(port=int(sys.argv[1])).start()
print("ready", flush=True)
sys.stdin.read()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", type=int, default=4)
    ap.add_argument("--exports", type=int, default=200)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        state = AgentState()
        for i in range(args.targets):
            for start in (1000.0, 1005.0):
                state.record_window(make_window(target=f"server{i}", start=start, end=start + 5))
        import tempfile
        from pathlib import Path

        from agent.alerts.config import AlertsConfig

        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp))
            s = settings(OtlpConfig(endpoint=f"http://127.0.0.1:{port}"), interval_seconds=args.interval,
                         environ={}, host="bench")
            exporter = OtlpExporter(s, build_registry(state), store, AlertsConfig(), host="bench",
                                    external_url="http://bench", started=time.time())
            assert exporter.export_metrics().accepted  # warm: imports, first connection
            cpu0, wall0 = time.process_time(), time.perf_counter()
            sizes = []
            for _ in range(args.exports):
                result = exporter.export_metrics()
                assert result.accepted, result.error
            cpu = (time.process_time() - cpu0) / args.exports
            wall = (time.perf_counter() - wall0) / args.exports
            from agent.otlp import metrics as m
            sizes.append(len(m.encode(m.metrics_data(build_registry(state).collect(), exporter.resource,
                                                     start_ns=0, now_ns=1))))
            store.close()
        print(json.dumps({"targets": args.targets, "exports": args.exports,
                          "cpu_ms_per_export": round(cpu * 1e3, 3), "wall_ms_per_export": round(wall * 1e3, 3),
                          "request_bytes": sizes[0],
                          "core_percent_at_interval": round(100 * cpu / args.interval, 4)}))
    finally:
        receiver.stdin.close()  # type: ignore[union-attr]
        receiver.wait(10)


if __name__ == "__main__":
    main()
