"""A Collector outage, measured: the real agent (BPF probes, py-spy) watching the bundled workload under load
exports to a loopback OTLP receiver, which goes away for `--outage` seconds; a GC fault is switched on and off
inside the outage, so a regression opens and closes while nothing can be delivered. Every `--every` seconds the
agent's /metrics is read: resident memory, windows, late ticks, OTLP failures and pending records. After the
receiver is back, the time until the regression's records arrive is measured.

Run as root: `.venv/bin/python -m tests.agent.bench_otlp_outage --outage 300`. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.agent.alerts.test_e2e_detector import fault
from tests.agent.otlp.receiver import OtlpReceiver
from tests.live import free_port, terminate, wait_http, workload_target, write_agent_config


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage", type=float, default=300.0)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="otlp-outage-"))
    os.chmod(tmp, 0o700)
    receiver = OtlpReceiver().start()
    port, agent_port = free_port(), free_port()
    token = f"otlp-outage-{uuid.uuid4().hex[:12]}"
    config = write_agent_config(tmp, agent_port, f"""
        [detector]
        warmup_windows = 10
        [otlp]
        endpoint = "{receiver.endpoint}"
    """, workload_target(token, port), interval=args.interval)
    logs = open(tmp / "processes.log", "w")
    procs = []
    readings = []
    agent_url = f"http://127.0.0.1:{agent_port}/metrics"
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port),
                                       "--admin-token", token], stdout=logs, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{port}/health", 120)
        procs.append(subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                       "--rate", "3", "--duration", "3600", "--no-progress"], stdout=logs,
                                      stderr=logs))
        procs.append(subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                      stdout=logs, stderr=subprocess.STDOUT))
        wait_http(f"http://127.0.0.1:{agent_port}/api/status", 60)
        time.sleep(args.interval * 14)  # warm-up

        def read(phase: str) -> None:
            m = scrape(agent_url)
            readings.append({"t": round(time.time() - t0, 1), "phase": phase,
                             "rss_mib": round(m["infersight_agent_resident_memory_bytes"] / 2**20, 1),
                             "windows": m["infersight_agent_windows_total"],
                             "late_ticks": m["infersight_agent_late_ticks_total"],
                             "otlp_errors": m.get("infersight_agent_errors_total,component=otlp", 0.0),
                             "pending_records": m["infersight_otlp_pending_records"]})

        t0 = time.time()
        read("before")
        receiver.stop()
        down = time.time()
        fault_on = fault_off = None
        while time.time() - down < args.outage:
            time.sleep(args.every)
            if fault_on is None and time.time() - down > args.outage * 0.2:
                fault(port, token, True)
                fault_on = time.time()
            elif fault_off is None and fault_on and time.time() - down > args.outage * 0.5:
                fault(port, token, False)
                fault_off = time.time()
            read("down")
        receiver.start()
        back = time.time()
        arrived = None
        while time.time() - back < 120:
            events = [r["event"] for r in receiver.log_records()]
            if "infersight.regression.opened" in events and "infersight.regression.closed" in events:
                arrived = time.time() - back
                break
            time.sleep(0.5)
        read("after")
    finally:
        for proc in reversed(procs):
            terminate(proc)
        logs.close()
        receiver.stop()
    down_readings = [r for r in readings if r["phase"] == "down"]
    print(json.dumps({
        "outage_s": args.outage, "interval_s": args.interval,
        "rss_mib_before": readings[0]["rss_mib"], "rss_mib_max_during": max(r["rss_mib"] for r in down_readings),
        "rss_mib_after": readings[-1]["rss_mib"],
        "windows_during": readings[-1]["windows"] - readings[0]["windows"],
        "windows_expected": round((readings[-1]["t"] - readings[0]["t"]) / args.interval, 1),
        "late_ticks_during": readings[-1]["late_ticks"] - readings[0]["late_ticks"],
        "otlp_errors_during": down_readings[-1]["otlp_errors"] - readings[0]["otlp_errors"],
        "pending_records_max": max(r["pending_records"] for r in down_readings),
        "records_arrived_s_after_back": None if arrived is None else round(arrived, 1),
        "records": [r["event"] for r in receiver.log_records()],
        "readings": readings,
    }))


if __name__ == "__main__":
    main()
